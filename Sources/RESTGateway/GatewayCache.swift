import Foundation
import GRDB
import NIOCore
import Synchronization

/// The gateway's answers that cannot change (closed days' bars, past days' trades and quotes) and
/// reference data for its TTL, in one SQLite file through GRDB: shared by every client, kept across
/// restarts, bounded in bytes with the least recently used answers evicted first.
///
/// `Sendable`: GRDB's `DatabaseQueue` serialises access; the byte total is behind a `Mutex`.
public final class GatewayCache: Sendable {
    public let path: String
    public let maxBytes: Int
    private let queue: DatabasePool
    private let total: Mutex<Int>
    /// The bytes of the cursors remembered (their text), within ``maxCursorBytes``.
    private let cursorTotal: Mutex<Int>

    public struct Entry: Sendable {
        public var body: ByteBuffer
        public var contentType: String
    }

    /// Opens (or creates) the cache file. Throws when the file cannot be opened or is not a cache.
    public init(path: String, maxBytes: Int) throws {
        self.path = path
        self.maxBytes = max(maxBytes, 1 << 16)
        try FileManager.default.createDirectory(
            atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
        var configuration = Configuration()
        configuration.busyMode = .timeout(5)
        // WAL (a pool) and no fsync per commit: a cache may lose its last answers in a power cut, never
        // its consistency.
        configuration.prepareDatabase { db in try db.execute(sql: "PRAGMA synchronous = NORMAL") }
        queue = try DatabasePool(path: path, configuration: configuration)
        var migrator = DatabaseMigrator()
        migrator.registerMigration("answers") { db in
            try db.execute(
                sql: """
                    CREATE TABLE answers(
                        key TEXT PRIMARY KEY NOT NULL, body BLOB NOT NULL, content_type TEXT NOT NULL,
                        expires_at INTEGER, used_at INTEGER NOT NULL, bytes INTEGER NOT NULL);
                    CREATE INDEX answers_used ON answers(used_at);
                    CREATE TABLE cursors(cursor TEXT PRIMARY KEY NOT NULL, expires_at INTEGER);
                    """)
        }
        migrator.registerMigration("a week at most") { db in
            // Answers kept until evicted by a version before: a week from now at most, as new ones are.
            let weekFromNow = "CAST(strftime('%s', 'now') AS INTEGER) * 1000 + 604800000"
            try db.execute(
                sql: """
                    UPDATE answers SET expires_at = \(weekFromNow) WHERE expires_at IS NULL;
                    UPDATE cursors SET expires_at = \(weekFromNow) WHERE expires_at IS NULL;
                    """)
        }
        try migrator.migrate(queue)
        let bytes = try queue.read { db in try Int.fetchOne(db, sql: "SELECT COALESCE(SUM(bytes), 0) FROM answers") ?? 0 }
        total = Mutex(bytes)
        cursorTotal = Mutex(try queue.read { db in try Self.cursorBytes(db) })
    }

    /// The bytes of the answers held.
    public var bytes: Int { total.withLock { $0 } }

    /// How many answers are held.
    public func count() async -> Int {
        (try? await queue.read { db in try Int.fetchOne(db, sql: "SELECT COUNT(*) FROM answers") ?? 0 }) ?? 0
    }

    /// The answer stored under `key` that has not expired by `now` (Unix ms); marks it used (at most
    /// once a minute: a hit is a read, not a write).
    public func answer(_ key: String, now: Int64) async -> Entry? {
        do {
            let found = try await queue.read { db -> (Entry, Int64)? in
                let rows = try Row.fetchCursor(
                    db, sql: "SELECT body, content_type, used_at FROM answers WHERE key = ? AND (expires_at IS NULL OR expires_at > ?)",
                    arguments: [key, now])
                guard let row = try rows.next() else { return nil }
                // Straight from SQLite's memory into the buffer: one copy of a page of megabytes, not three.
                let body = try row.withUnsafeData(named: "body") { data in data.map { ByteBuffer(bytes: $0) } ?? ByteBuffer() }
                return (Entry(body: body, contentType: row["content_type"]), row["used_at"])
            }
            guard let (entry, used) = found else { return nil }
            if now - used > 60_000 {
                try? await queue.write { db in try db.execute(sql: "UPDATE answers SET used_at = ? WHERE key = ?", arguments: [now, key]) }
            }
            return entry
        } catch {
            return nil
        }
    }

    /// Stores an answer until `expires` (`nil`: until evicted), then evicts the least recently used
    /// answers until the total is within the bound. An answer over an eighth of the bound is not kept.
    public func store(_ key: String, body: ByteBuffer, contentType: String, expires: Int64?, now: Int64) async {
        let size = body.readableBytes + key.utf8.count
        guard size <= maxBytes / 8 else { return }
        let maxBytes = self.maxBytes
        do {
            try await queue.write { db in
                let previous = try Int.fetchOne(db, sql: "SELECT bytes FROM answers WHERE key = ?", arguments: [key]) ?? 0
                try db.execute(
                    sql: "INSERT OR REPLACE INTO answers(key, body, content_type, expires_at, used_at, bytes) VALUES (?, ?, ?, ?, ?, ?)",
                    arguments: [key, Data(body.readableBytesView), contentType, expires, now, size])
                // The running total (writes are serialised: nothing changes it between).
                var held = self.total.withLock { $0 } + size - previous
                // Expired answers go first, then the least recently used.
                if held > maxBytes {
                    try db.execute(sql: "DELETE FROM answers WHERE expires_at IS NOT NULL AND expires_at <= ?", arguments: [now])
                    held = try Int.fetchOne(db, sql: "SELECT COALESCE(SUM(bytes), 0) FROM answers") ?? 0
                }
                while held > maxBytes {
                    let rows = try Row.fetchAll(db, sql: "SELECT key, bytes FROM answers WHERE key != ? ORDER BY used_at LIMIT 32", arguments: [key])
                    if rows.isEmpty { break }
                    for row in rows where held > maxBytes {
                        let evicted: String = row["key"]
                        try db.execute(sql: "DELETE FROM answers WHERE key = ?", arguments: [evicted])
                        held -= row["bytes"] as Int
                    }
                }
                let expired = try Int.fetchAll(
                    db, sql: "DELETE FROM cursors WHERE expires_at IS NOT NULL AND expires_at <= ? RETURNING \(Self.cursorLength)", arguments: [now])
                if !expired.isEmpty { self.cursorTotal.withLock { $0 -= expired.reduce(0, +) } }
                self.total.withLock { $0 = held }
            }
        } catch {
            // A cache that cannot write serves from upstream; nothing is lost.
        }
    }

    /// The cursors remembered at most (the oldest are forgotten first: their pages then pass through).
    public static let maxCursors = 100_000

    /// The bytes of cursors remembered at most: an eighth of the cache's bound, beside its answers (a
    /// remembered page, as the dialect names it (its path and cursor), is up to 4 KiB; 100,000 of them
    /// would be 400 MB outside the bound).
    public var maxCursorBytes: Int { maxBytes / 8 }

    /// The bytes of the cursors remembered now.
    public var cursorBytes: Int { cursorTotal.withLock { $0 } }

    /// Remembers that the pages these cursors name may be cached as the answer that named them; the
    /// oldest cursors are forgotten past ``maxCursors`` or ``maxCursorBytes``.
    public func remember(cursors: [String], expires: Int64?) async {
        guard !cursors.isEmpty else { return }
        do {
            try await rememberWriting(cursors, expires: expires)
        } catch {
            // Not committed: the running count may have moved with the rows that stayed; counted again.
            if let bytes = try? await queue.read({ db in try Self.cursorBytes(db) }) { cursorTotal.withLock { $0 = bytes } }
        }
    }

    private func rememberWriting(_ cursors: [String], expires: Int64?) async throws {
        try await queue.write { db in
            var held = self.cursorTotal.withLock { $0 }
            for cursor in cursors.prefix(16) where cursor.utf8.count <= 4096 {
                let known = try Bool.fetchOne(db, sql: "SELECT 1 FROM cursors WHERE cursor = ?", arguments: [cursor]) ?? false
                try db.execute(sql: "INSERT OR REPLACE INTO cursors(cursor, expires_at) VALUES (?, ?)", arguments: [cursor, expires])
                if !known { held += cursor.utf8.count }
            }
            // What goes is subtracted as it goes (the table is not summed again: it may hold 100,000).
            held -= try Int.fetchAll(
                db, sql: "DELETE FROM cursors WHERE rowid <= (SELECT MAX(rowid) FROM cursors) - ? RETURNING \(Self.cursorLength)",
                arguments: [Self.maxCursors]
            ).reduce(0, +)
            while held > self.maxCursorBytes {
                let gone = try Int.fetchAll(
                    db, sql: "DELETE FROM cursors WHERE rowid IN (SELECT rowid FROM cursors ORDER BY rowid LIMIT 16) RETURNING \(Self.cursorLength)")
                guard !gone.isEmpty else { break }
                held -= gone.reduce(0, +)
            }
            self.cursorTotal.withLock { $0 = held }
        }
    }

    /// A cursor's bytes, in SQL.
    private static let cursorLength = "LENGTH(CAST(cursor AS BLOB))"

    private static func cursorBytes(_ db: Database) throws -> Int {
        try Int.fetchOne(db, sql: "SELECT COALESCE(SUM(\(cursorLength)), 0) FROM cursors") ?? 0
    }

    /// How long the page a cursor names may be cached: `.some(nil)` forever, `.some(t)` until `t`,
    /// `nil`: the cursor came from no cached answer.
    public func cursorPolicy(_ cursor: String, now: Int64) async -> Int64?? {
        do {
            return try await queue.read { db -> Int64?? in
                guard let row = try Row.fetchOne(db, sql: "SELECT expires_at FROM cursors WHERE cursor = ?", arguments: [cursor]) else { return nil }
                let expires: Int64? = row["expires_at"]
                if let expires, expires <= now { return nil }
                return .some(expires)
            }
        } catch {
            return nil
        }
    }
}
