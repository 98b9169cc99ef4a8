import Foundation
import GRDB
import MarketCore
import NIOCore
import RESTGateway
import RelayTestSupport
import Testing

/// The gateway's cache in a real SQLite file: kept across opens, expired answers not served, the byte
/// bound held by evicting the least recently used.
@Suite("REST gateway: the cache")
struct GatewayCacheTests {
    func withFile(_ body: (String) async throws -> Void) async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("gateway-cache-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await body("\(directory)/cache.sqlite")
    }

    @Test func answersOutliveTheProcessUntilTheyExpire() async throws {
        try await withFile { path in
            let first = try GatewayCache(path: path, maxBytes: 1 << 20)
            await first.store("a", body: ByteBuffer(string: "forever"), contentType: "application/json", expires: nil, now: 1_000)
            await first.store("b", body: ByteBuffer(string: "until 2000"), contentType: "application/json", expires: 2_000, now: 1_000)
            let reopened = try GatewayCache(path: path, maxBytes: 1 << 20)
            #expect(await reopened.answer("a", now: 5_000).map { String(buffer: $0.body) } == "forever")
            #expect(await reopened.answer("b", now: 1_500).map { String(buffer: $0.body) } == "until 2000")
            #expect(await reopened.answer("b", now: 2_000) == nil, "expired")
            #expect(reopened.bytes == first.bytes)
        }
    }

    @Test func answersAVersionBeforeKeptUntilEvictedAreKeptAWeekAtMost() async throws {
        try await withFile { path in
            let cache = try GatewayCache(path: path, maxBytes: 1 << 20)
            await cache.store("a", body: ByteBuffer(string: "old"), contentType: "application/json", expires: nil, now: 1_000)
            await cache.remember(cursors: ["c1"], expires: nil)
            // As a version before this one left the file: the migration not run yet.
            try await sideConnection(to: path).write { db in
                try db.execute(sql: "DELETE FROM grdb_migrations WHERE identifier = 'a week at most'")
            }
            let reopened = try GatewayCache(path: path, maxBytes: 1 << 20)
            let now = WallClock.nowMilliseconds()
            #expect(await reopened.answer("a", now: now).map { String(buffer: $0.body) } == "old")
            #expect(await reopened.answer("a", now: now + 8 * 86_400_000) == nil, "gone after a week")
            guard case .some(.some(let expires)) = await reopened.cursorPolicy("c1", now: now) else {
                Issue.record("the cursor is kept until evicted")
                return
            }
            #expect(expires <= now + 7 * 86_400_000 + 60_000)
        }
    }

    @Test func theBoundEvictsTheLeastRecentlyUsed() async throws {
        try await withFile { path in
            let cache = try GatewayCache(path: path, maxBytes: 1 << 16)
            let body = ByteBuffer(string: String(repeating: "x", count: 4_000))
            for index in 0..<15 {
                await cache.store("k\(index)", body: body, contentType: "application/json", expires: nil, now: Int64(index))
            }
            // k0 is read (so recently used); then more answers push past the bound.
            #expect(await cache.answer("k0", now: 100) != nil)
            for index in 15..<40 {
                await cache.store("k\(index)", body: body, contentType: "application/json", expires: nil, now: 200 + Int64(index))
            }
            #expect(cache.bytes <= 1 << 16)
            #expect(await cache.answer("k1", now: 1_000) == nil, "the least recently used went first")
            #expect(await cache.answer("k39", now: 1_000) != nil)
            #expect(await cache.count() < 40)
        }
    }

    @Test func cursorsOfCachedAnswersAreRemembered() async throws {
        try await withFile { path in
            let cache = try GatewayCache(path: path, maxBytes: 1 << 20)
            await cache.remember(cursors: ["c1"], expires: nil)
            await cache.remember(cursors: ["c2"], expires: 500)
            #expect(await cache.cursorPolicy("c1", now: 1_000) == .some(nil))
            #expect(await cache.cursorPolicy("c2", now: 100) == .some(500))
            #expect(await cache.cursorPolicy("c2", now: 600) == nil)
            #expect(await cache.cursorPolicy("unknown", now: 100) == nil)
        }
    }

    /// Cursors come from the vendor's answers, up to 4 KiB each: their bytes stay within an eighth of
    /// the cache's bound, the oldest forgotten first, across a reopen too.
    @Test func cursorsAreBoundedInBytesOldestFirst() async throws {
        try await withFile { path in
            let cache = try GatewayCache(path: path, maxBytes: 1 << 20)
            let bound = cache.maxCursorBytes
            for index in 0..<100 {
                let cursors = (0..<16).map { "c\(index)-\($0)-" + String(repeating: "x", count: 4_000) }
                await cache.remember(cursors: cursors, expires: nil)
            }
            #expect(cache.cursorBytes <= bound && cache.cursorBytes > bound / 4, "\(cache.cursorBytes) of \(bound)")
            #expect(await cache.cursorPolicy("c0-0-" + String(repeating: "x", count: 4_000), now: 1) == nil, "the oldest forgotten")
            #expect(await cache.cursorPolicy("c99-15-" + String(repeating: "x", count: 4_000), now: 1) == .some(nil), "the newest kept")
            await cache.remember(cursors: ["c99-15-" + String(repeating: "x", count: 4_000)], expires: nil)
            let reopened = try GatewayCache(path: path, maxBytes: 1 << 20)
            #expect(reopened.cursorBytes == cache.cursorBytes, "counted once, and read back as counted")
        }
    }
}
