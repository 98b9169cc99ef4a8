import Foundation
import AlpacaWire
import Benchmark
import MarketDataHub
import NIOCore
import NIOEmbedded
import PolygonWire

/// A frame as Polygon sends it: 50 quotes over 100 symbols.
func quoteFrame(events: Int = 50) -> ByteBuffer {
    let elements = (0..<events).map { index in
        #"{"ev":"Q","sym":"S\#(String(format: "%03d", index % 100))","bx":4,"bp":114.125,"bs":100,"ax":7,"ap":114.128,"as":160,"c":0,"i":[604],"t":1536036818784,"q":\#(50_385_480 + index),"z":3}"#
    }
    return ByteBuffer(string: "[" + elements.joined(separator: ",") + "]")
}

/// An Alpaca order book change (`o`) of `levels` levels a side around `price`, or the whole book.
func bookEvent(levels: Int, price: Double, offset: Int, reset: Bool) -> MarketEvent {
    func side(_ sign: Double) -> MessagePack.Value {
        .array((1...levels).map { level in
            .map([.init(.string("p"), .double(price + sign * Double(level + offset) / 100)), .init(.string("s"), .double(Double(level % 7) / 4 + 0.25))])
        })
    }
    var fields: [(String, MessagePack.Value)] = [("T", .string("o")), ("S", .string("BTC/USD")), ("b", side(-1)), ("a", side(1))]
    if reset { fields.append(("r", .bool(true))) }
    return AlpacaEvents.event("o", "BTC/USD", fields)
}

/// The process's resident bytes now (`/proc/self/statm`).
func residentBytes() -> Int {
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let fields = text.split(separator: " ")
    return fields.count > 1 ? (Int(fields[1]) ?? 0) * 4096 : 0
}

let benchmarks: @Sendable () -> Void = {
    // Order books a late joiner starts from: what one change costs to fold, what a whole book costs to
    // render, and what 1,000 books of 200 levels a side hold in memory.
    Benchmark(
        "AlpacaOrderBook.apply: a 4-level change to a 200-level book",
        configuration: .init(metrics: [.throughput, .wallClock, .mallocCountTotal], maxDuration: .seconds(3))
    ) { benchmark in
        let book = AlpacaOrderBook(symbol: "BTC/USD", levels: 1000)
        book.apply(bookEvent(levels: 200, price: 97_000, offset: 0, reset: true))
        let changes = (0..<64).map { bookEvent(levels: 2, price: 97_000, offset: $0 % 50, reset: false) }
        benchmark.startMeasurement()
        for iteration in benchmark.scaledIterations {
            book.apply(changes[iteration % changes.count])
        }
        benchmark.stopMeasurement()
    }
    Benchmark(
        "AlpacaOrderBook.whole: a 200-level book rendered for a late joiner",
        configuration: .init(metrics: [.throughput, .wallClock, .mallocCountTotal], maxDuration: .seconds(3))
    ) { benchmark in
        let book = AlpacaOrderBook(symbol: "BTC/USD", levels: 1000)
        book.apply(bookEvent(levels: 200, price: 97_000, offset: 0, reset: true))
        let change = bookEvent(levels: 1, price: 97_000, offset: 3, reset: false)
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations {
            // Each change drops the rendered form: a join after it renders the book again.
            book.apply(change)
            blackHole(book.whole())
        }
        benchmark.stopMeasurement()
    }
    Benchmark(
        "AlpacaOrderBook: 1,000 books of 200 levels a side (memory)",
        configuration: .init(metrics: [.peakMemoryResident, .wallClock], maxDuration: .seconds(3), maxIterations: 1)
    ) { benchmark in
        let reset = bookEvent(levels: 200, price: 97_000, offset: 0, reset: true)
        let before = residentBytes()
        benchmark.startMeasurement()
        var books: [AlpacaOrderBook] = []
        for index in 0..<1000 {
            let book = AlpacaOrderBook(symbol: "S\(index)", levels: 1000)
            book.apply(reset)
            books.append(book)
        }
        let footprint = books.reduce(0) { $0 + $1.footprint }
        benchmark.stopMeasurement()
        print("1,000 books of 200 levels a side: resident +\((residentBytes() - before) / 1000) bytes per book (footprint \(footprint / 1000))")
    }

    let frame = quoteFrame()

    // Throughput is frames per second: multiply by 50 for events per second.
    Benchmark(
        "FrameParser.parse: 50-quote frame",
        configuration: .init(metrics: [.throughput, .wallClock, .mallocCountTotal, .instructions], maxDuration: .seconds(3))
    ) { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(try FrameParser.parse(frame))
        }
    }

    let events = (try? FrameParser.parse(frame).events) ?? []
    Benchmark(
        "FrameEncoder.frames: 50 events into one frame",
        configuration: .init(metrics: [.throughput, .wallClock, .mallocCountTotal], maxDuration: .seconds(3))
    ) { benchmark in
        for _ in benchmark.scaledIterations {
            blackHole(FrameEncoder.frames(for: events))
        }
    }

    // The fanout shape: 100 subscribers × 20 of 100 symbols; one publish of a 50-event frame, then every
    // subscriber drains what it got (about 10 events each, 1,000 deliveries per publish): the hub's fan-out
    // and the streams' read, in one task, without sockets, framing or thread hand-offs. Measured warm
    // (each topic's history line made, the tables grown), 1,000 publishes a sample; the tool reports
    // per publish, so the time per publish in µs is the steady cost of one delivery in ns.
    Benchmark(
        "MarketDataHub.publish: 50 events to 100 subscribers × 20 of 100 symbols, drained",
        configuration: .init(metrics: [.throughput, .wallClock, .mallocCountTotal], scalingFactor: .kilo, maxDuration: .seconds(5))
    ) { benchmark in
        let hub = MarketDataHub(wire: PolygonWireProtocol(), snapshotOnSubscribe: false)
        var readers: [HubSubscription.Reader] = []
        for subscriber in 0..<100 {
            let topics = Set((0..<20).map { Topic(eventType: "Q", ticker: "S" + String(format: "%03d", (subscriber * 7 + $0 * 37) % 100))! })
            readers.append(await hub.subscribe(to: topics).makeReader())
        }
        var deliveries: [HubDelivery] = []
        func round() async {
            await hub.publish(events)
            for index in readers.indices {
                blackHole(await readers[index].nextDeliveries(into: &deliveries))
                deliveries.removeAll(keepingCapacity: true)
            }
        }
        for _ in 0..<20 { await round() }
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations { await round() }
        benchmark.stopMeasurement()
    }

    // A mass close: 10,000 connections holding the same popular topic and its type's wildcard (a fleet of
    // dashboards on one index) all leave, in the order they came. Each iteration subscribes them (not
    // measured) and removes them (measured): the cost of taking holders out of a topic's list.
    Benchmark(
        "MarketDataHub.remove: 10,000 holders of one topic and its wildcard leave",
        configuration: .init(metrics: [.wallClock], maxDuration: .seconds(10), maxIterations: 20)
    ) { benchmark in
        for _ in benchmark.scaledIterations {
            let hub = MarketDataHub(wire: PolygonWireProtocol(), snapshotOnSubscribe: false)
            let held: Set<Topic> = [Topic(eventType: "T", ticker: "SPY")!, Topic(eventType: "Q", ticker: "*")!]
            var ids: [SubscriberID] = []
            for _ in 0..<10_000 { ids.append(await hub.subscribe(to: held).id) }
            benchmark.startMeasurement()
            for id in ids { await hub.remove(id) }
            benchmark.stopMeasurement()
        }
    }

    // The topic table's bound: a market of 500,000 topics nobody holds (a wildcard's, an options
    // market's), then 50,001 new ones in publishes of 1,000, the last of which trims the table back to
    // 450,000 (the measured part: the 51 publishes, the trim among them).
    Benchmark(
        "MarketDataHub.trim: 50,001 new topics past a table of 500,000 nobody holds",
        configuration: .init(metrics: [.wallClock], maxDuration: .seconds(30), maxIterations: 5)
    ) { benchmark in
        func quotes(_ range: Range<Int>) -> [MarketEvent] {
            range.map { MarketEvent(eventType: "Q", ticker: "O\($0)", bytes: ByteBuffer(string: #"{"ev":"Q","sym":"O\#($0)"}"#), receivedAt: UInt64($0)) }
        }
        for _ in benchmark.scaledIterations {
            let hub = MarketDataHub(wire: PolygonWireProtocol(), snapshotOnSubscribe: false, history: nil)
            for start in stride(from: 0, to: 500_000, by: 1_000) { await hub.publish(quotes(start..<start + 1_000)) }
            let batches = stride(from: 500_000, to: 550_001, by: 1_000).map { quotes($0..<Swift.min($0 + 1_000, 550_001)) }
            benchmark.startMeasurement()
            for batch in batches { await hub.publish(batch) }
            benchmark.stopMeasurement()
            blackHole(await hub.topicEntryCount)
        }
    }

    // The downstream write path, gated on allocations (stable where times are not): one upstream frame
    // of 50 events published to the fanout shape, each subscriber's deliveries taken, built into one
    // whole WebSocket frame and written to its channel as the relay does (below the frame encoder).
    // One iteration delivers about 100 frames; `scripts/bench-micro check` fails when its malloc count
    // rises above the stored threshold.
    Benchmark(
        "WritePathAllocations",
        configuration: .init(metrics: [.mallocCountTotal], maxDuration: .seconds(2), maxIterations: 2_000)
    ) { benchmark in
        let hub = MarketDataHub(wire: PolygonWireProtocol(), snapshotOnSubscribe: false)
        var readers: [HubSubscription.Reader] = []
        var channels: [EmbeddedChannel] = []
        for subscriber in 0..<100 {
            let topics = Set((0..<20).map { Topic(eventType: "Q", ticker: "S" + String(format: "%03d", (subscriber * 7 + $0 * 37) % 100))! })
            readers.append(await hub.subscribe(to: topics).makeReader())
            // No frame encoder: the relay writes its whole frames in front of it (its outlet).
            channels.append(EmbeddedChannel())
        }
        var deliveries: [HubDelivery] = []
        benchmark.startMeasurement()
        for _ in benchmark.scaledIterations {
            await hub.publish(events)
            for index in readers.indices {
                guard await readers[index].nextDeliveries(into: &deliveries) else { continue }
                let payload = deliveries.reduce(1) { $0 + $1.framedBytes }
                let built = WireFrameBuilder.build(payload: payload, allocator: channels[index].allocator) { builder in
                    for delivery in deliveries { delivery.forEachEventAddress { builder.append($0) } }
                }
                deliveries.removeAll(keepingCapacity: true)
                channels[index].write(built.frame, promise: nil)
                channels[index].flush()
                // What the socket would take: drained, so the next write starts from nothing queued.
                while let written = try channels[index].readOutbound(as: ByteBuffer.self) { blackHole(written) }
            }
        }
        benchmark.stopMeasurement()
    }
}
