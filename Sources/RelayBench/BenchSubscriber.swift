import AlpacaWire
import Histogram
import HummingbirdWSClient
import Logging
import NIOCore
import PolygonWire
import Synchronization

/// One benchmark client: subscribes, then counts what arrives per upstream tick and records latency
/// from each event's `"rt"` send stamp. `Sendable`: its counts sit behind a `Mutex` touched once per
/// frame.
final class BenchSubscriber: Sendable {
    struct Counts: Sendable {
        /// Events per send stamp (one stamp per upstream tick), so the measured window can be cut exactly.
        var byStamp: [Int64: Int] = [:]
        var laggingNotices = 0
        var dropped = 0
        var received = 0
        /// Derived bars (`AM.S000@5s`) whose window ended inside the measured window.
        var bars = 0
        /// Failover probe: the first arrival (Unix ns) of an event sent after `probeAfter`.
        var probeAfter: Int64?
        var firstArrivalAfterProbe: Int64?
    }

    /// Latency is recorded for events stamped inside this window (Unix ns); set by the runner.
    final class Window: Sendable {
        let start = Atomic<Int64>(.max)
        let end = Atomic<Int64>(.max)
    }

    /// A latency histogram shared by several subscribers: one histogram is hundreds of kilobytes, so
    /// ten thousand clients must not each own one.
    final class LatencyShard: Sendable {
        let histogram = Mutex(Histogram<UInt64>(highestTrackableValue: 120_000_000_000, numberOfSignificantValueDigits: .three))
    }

    let topics: [String]
    let stalled: Bool
    let latency: LatencyShard
    /// Speaks Alpaca's protocol in this codec (MessagePack as Alpaca's SDKs do); `nil`: Polygon's.
    let alpaca: AlpacaCodec?
    let counts = Mutex(Counts())
    let subscribed = Mutex(false)

    init(topics: [String], stalled: Bool, latency: LatencyShard, alpaca: AlpacaCodec? = nil) {
        self.topics = topics
        self.stalled = stalled
        self.latency = latency
        self.alpaca = alpaca
    }

    /// Connects and runs until cancelled. `ready` is called once the subscription is acknowledged.
    func run(url: String, window: Window, logger: Logger, ready: @escaping @Sendable () -> Void) async throws {
        if let alpaca { return try await runAlpaca(url: url, codec: alpaca, window: window, logger: logger, ready: ready) }
        let topics = self.topics
        let stalled = self.stalled
        try await WebSocketClient.connect(url: url, configuration: .init(maxFrameSize: 1 << 22), logger: logger) { inbound, outbound, _ in
            try await outbound.write(.text(ClientAction(.auth, params: "bench").json))
            try await outbound.write(.text(ClientAction(.subscribe, params: topics.joined(separator: ",")).json))
            var iterator = inbound.makeAsyncIterator()
            var acknowledged = false
            var partial: ByteBuffer?
            while let frame = try await iterator.next() {
                var data = frame.data
                if !frame.fin {
                    partial = partial ?? ByteBuffer()
                    partial?.writeBuffer(&data)
                    continue
                }
                if var pending = partial {
                    pending.writeBuffer(&data)
                    data = pending
                    partial = nil
                }
                guard let parsed = try? FrameParser.parse(data) else { continue }
                if !acknowledged, parsed.statuses.contains(where: { $0.status == StatusMessage.Kind.success }) {
                    acknowledged = true
                    self.subscribed.withLock { $0 = true }
                    ready()
                    if stalled {
                        // Never read again: the relay must keep this from hurting anyone else.
                        try await Task.sleep(for: .seconds(86_400))
                    }
                }
                self.record(parsed, window: window)
            }
        }
    }

    private func record(_ parsed: ParsedFrame, window: Window) {
        let now = WallClock.nowNanoseconds()
        let start = window.start.load(ordering: .relaxed)
        let end = window.end.load(ordering: .relaxed)
        var latencies: [UInt64] = []
        counts.withLock { counts in
            counts.received += parsed.events.count
            var stamp: Int64 = 0
            var run = 0
            for event in parsed.events {
                if event.ticker.utf8.contains(UInt8(ascii: "@")), let barEnd = Self.barEnd(event.bytes), barEnd * 1_000_000 >= start, barEnd * 1_000_000 <= end {
                    counts.bars += 1
                }
                guard let rt = Self.sendStamp(event.bytes) else { continue }
                if rt != stamp {
                    if run > 0 { counts.byStamp[stamp, default: 0] += run }
                    stamp = rt
                    run = 0
                }
                run += 1
                if rt >= start, rt <= end, now > rt { latencies.append(UInt64(now - rt)) }
                if let after = counts.probeAfter, rt > after, counts.firstArrivalAfterProbe == nil { counts.firstArrivalAfterProbe = now }
            }
            if run > 0 { counts.byStamp[stamp, default: 0] += run }
            for status in parsed.statuses where status.status == StatusMessage.Kind.lagging {
                counts.laggingNotices += 1
            }
        }
        if !latencies.isEmpty {
            latency.histogram.withLock { histogram in
                for value in latencies { _ = histogram.record(value) }
            }
        }
    }

    /// The same conversation in Alpaca's protocol: MessagePack both ways (`Content-Type` on the
    /// upgrade), or JSON text.
    private func runAlpaca(url: String, codec: AlpacaCodec, window: Window, logger: Logger, ready: @escaping @Sendable () -> Void) async throws {
        var channels: [String: [MessagePack.Value]] = [:]
        for topic in topics {
            guard let dot = topic.firstIndex(of: ".") else { continue }
            let name = topic[..<dot] == "t" ? "trades" : topic[..<dot] == "b" ? "bars" : "quotes"
            channels[name, default: []].append(.string(String(topic[topic.index(after: dot)...])))
        }
        let auth = MessagePack.Value.map([
            .init(.string("action"), .string("auth")), .init(.string("key"), .string("bench")), .init(.string("secret"), .string("bench")),
        ])
        let subscribe = MessagePack.Value.map(
            [.init(.string("action"), .string("subscribe"))] + channels.sorted { $0.key < $1.key }.map { .init(.string($0.key), .array($0.value)) })
        let stalled = self.stalled
        var configuration = WebSocketClientConfiguration(maxFrameSize: 1 << 22)
        if codec == .messagePack { configuration.additionalHeaders[.contentType] = "application/msgpack" }
        try await WebSocketClient.connect(url: url, configuration: configuration, logger: logger) { inbound, outbound, _ in
            for message in [auth, subscribe] {
                switch codec {
                case .messagePack: try await outbound.write(.binary(ByteBuffer(bytes: MessagePack.encode(message))))
                case .json: try await outbound.write(.text(String(decoding: AlpacaJSON.text(message), as: UTF8.self)))
                }
            }
            var acknowledged = false
            for try await message in inbound.messages(maxSize: 1 << 24) {
                if case .text(let text) = message {
                    // JSON: the subscription reply is found by its text, events by their `"rt":` stamps.
                    if !acknowledged, text.contains(#""T":"subscription""#) {
                        acknowledged = true
                        self.subscribed.withLock { $0 = true }
                        ready()
                        if stalled { try await Task.sleep(for: .seconds(86_400)) }
                    }
                    self.recordAlpacaJSON(text, window: window)
                    continue
                }
                guard case .binary(let data) = message else { continue }
                let items = (try? data.withUnsafeReadableBytes { try AlpacaFrame.read($0) }) ?? []
                if !acknowledged, items.contains(where: { if case .control(let value) = $0 { value["T"]?.string == "subscription" } else { false } }) {
                    acknowledged = true
                    self.subscribed.withLock { $0 = true }
                    ready()
                    if stalled { try await Task.sleep(for: .seconds(86_400)) }
                }
                self.recordAlpaca(items, in: data, window: window)
            }
        }
    }

    /// A JSON frame of Alpaca's: every `"rt":` stamp in it (one per event), without parsing the rest.
    private func recordAlpacaJSON(_ text: String, window: Window) {
        var stamps: [Int64] = []
        let key = Array(#""rt":"#.utf8)
        var text = text
        text.withUTF8 { utf8 in
            let raw = UnsafeRawBufferPointer(utf8)
            var index = 0
            while index + key.count <= raw.count {
                guard raw[index] == key[0], (1..<key.count).allSatisfy({ raw[index + $0] == key[$0] }) else {
                    index += 1
                    continue
                }
                index += key.count
                if let value = Self.number(in: raw, at: &index) { stamps.append(value) }
            }
        }
        let lagging = text.contains(#""status":"lagging""#) || text.contains(#""code":407"#) ? 1 : 0
        record(stamps: stamps, lagging: lagging, window: window)
    }

    private func recordAlpaca(_ items: [AlpacaFrame.Item], in data: ByteBuffer, window: Window) {
        var stamps: [Int64] = []
        var lagging = 0
        data.withUnsafeReadableBytes { raw in
            for item in items {
                switch item {
                case .event(_, _, let range):
                    if let rt = Self.alpacaSendStamp(UnsafeRawBufferPointer(rebasing: raw[range])) { stamps.append(rt) }
                case .control(let value):
                    if value["status"]?.string == StatusMessage.Kind.lagging || value["code"]?.integer == 407 { lagging += 1 }
                case .unknown, .news:
                    break
                }
            }
        }
        record(stamps: stamps, lagging: lagging, window: window)
    }

    private func record(stamps: [Int64], lagging: Int, window: Window) {
        let now = WallClock.nowNanoseconds()
        let start = window.start.load(ordering: .relaxed)
        let end = window.end.load(ordering: .relaxed)
        var latencies: [UInt64] = []
        counts.withLock { counts in
            counts.received += stamps.count
            counts.laggingNotices += lagging
            for rt in stamps {
                counts.byStamp[rt, default: 0] += 1
                if rt >= start, rt <= end, now > rt { latencies.append(UInt64(now - rt)) }
                if let after = counts.probeAfter, rt > after, counts.firstArrivalAfterProbe == nil { counts.firstArrivalAfterProbe = now }
            }
        }
        if !latencies.isEmpty {
            latency.histogram.withLock { histogram in
                for value in latencies { _ = histogram.record(value) }
            }
        }
    }

    /// The `"rt"` of an Alpaca event (a MessagePack map), its other values passed over unread.
    static func alpacaSendStamp(_ event: UnsafeRawBufferPointer) -> Int64? {
        var reader = MessagePack.Reader(event)
        guard let count = try? reader.mapCount() else { return nil }
        for _ in 0..<count {
            guard let key = try? reader.stringBytes() else { return nil }
            if key.count == 2, key[0] == UInt8(ascii: "r"), key[1] == UInt8(ascii: "t") { return (try? reader.value())?.integer }
            guard (try? reader.skip()) != nil else { return nil }
        }
        return nil
    }

    /// The `"rt"` the bench feed appends to each event (`…,"rt":1763748302311000000`), found from the
    /// end: the relay writes its positions (`"_s"`, `"_m"`) after it.
    /// A Polygon bar's end (`"e"`, Unix ms).
    static func barEnd(_ bytes: ByteBuffer) -> Int64? {
        bytes.withUnsafeReadableBytes { raw -> Int64? in
            let key = Array(#","e":"#.utf8)
            guard raw.count > key.count else { return nil }
            for start in 0...(raw.count - key.count) where raw[start] == key[0] && (0..<key.count).allSatisfy({ raw[start + $0] == key[$0] }) {
                var index = start + key.count
                return number(in: raw, at: &index)
            }
            return nil
        }
    }

    static func sendStamp(_ bytes: ByteBuffer) -> Int64? {
        bytes.withUnsafeReadableBytes { raw -> Int64? in
            let key = Array(#","rt":"#.utf8)
            var start = raw.count - key.count
            while start >= 0 {
                if raw[start] == key[0], (0..<key.count).allSatisfy({ raw[start + $0] == key[$0] }) { break }
                start -= 1
            }
            guard start >= 0 else { return nil }
            var index = start + key.count
            return number(in: raw, at: &index)
        }
    }

    /// The decimal digits at `index` (at most 19) as a number, `index` moved past them; `nil`: none.
    static func number(in raw: UnsafeRawBufferPointer, at index: inout Int) -> Int64? {
        var value: Int64 = 0
        var digits = 0
        while index < raw.count, raw[index] >= 0x30, raw[index] <= 0x39, digits < 19 {
            value = value * 10 + Int64(raw[index] - 0x30)
            index += 1
            digits += 1
        }
        return digits > 0 ? value : nil
    }
}
