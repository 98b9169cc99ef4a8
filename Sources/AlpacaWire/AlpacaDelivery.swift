import NIOCore
import PolygonWire

/// Events of an Alpaca hub as a client's frames, in its codec. Each event's bytes are its MessagePack
/// map as the upstream sent it: a MessagePack client gets them under a new array header, unchanged; a
/// JSON client gets each written as Alpaca's JSON. The relay's own notices (Polygon-style statuses in
/// the hub) become `{"T":"relay","status":…,"msg":…}`, each alone in its frame: a `T` the SDKs pass over.
/// Pure.
public enum AlpacaDelivery {
    /// Frame payloads, in order, none past `maxFrameBytes` unless one event is.
    public static func payloads(_ events: [MarketEvent], codec: AlpacaCodec, maxFrameBytes: Int = FrameEncoder.maxFrameBytes) -> [ByteBuffer] {
        var payloads: [ByteBuffer] = []
        var run: [MarketEvent] = []
        var runBytes = 0
        func flush() {
            guard !run.isEmpty else { return }
            payloads.append(frame(run, codec: codec))
            run.removeAll(keepingCapacity: true)
            runBytes = 0
        }
        for event in events {
            if event.isNotice {
                flush()
                payloads.append(ByteBuffer(bytes: codec.frame([notice(event)])))
                continue
            }
            // JSON is about as long as the MessagePack it comes from, and often longer: counted double.
            let weight = codec == .messagePack ? event.bytes.readableBytes : 2 * event.bytes.readableBytes
            if runBytes + weight > maxFrameBytes { flush() }
            run.append(event)
            runBytes += weight
        }
        flush()
        return payloads
    }

    private static func frame(_ events: [MarketEvent], codec: AlpacaCodec) -> ByteBuffer {
        switch codec {
        case .messagePack:
            var writer = MessagePack.Writer(capacity: 5 + events.reduce(0) { $0 + $1.bytes.readableBytes })
            writer.arrayHeader(events.count)
            for event in events { writer.raw(event.bytes.readableBytesView) }
            return ByteBuffer(bytes: writer.bytes)
        case .json:
            var out: [UInt8] = [UInt8(ascii: "[")]
            var first = true
            for event in events {
                guard let value = try? MessagePack.decode(event.bytes.readableBytesView) else { continue }
                if !first { out.append(UInt8(ascii: ",")) }
                first = false
                AlpacaJSON.append(value, to: &out)
            }
            out.append(UInt8(ascii: "]"))
            return ByteBuffer(bytes: out)
        }
    }

    /// A hub notice (`{"ev":"status","status":…,"message":…}`) in Alpaca's shape.
    static func notice(_ event: MarketEvent) -> MessagePack.Value {
        var entries: [MessagePack.Value.Entry] = [.init(.string("T"), .string(AlpacaControl.noticeType))]
        if case .map(let fields)? = AlpacaJSONReader.value(Array(event.bytes.readableBytesView)) {
            for field in fields where field.key != .string("ev") {
                entries.append(field.key == .string("message") ? .init(.string("msg"), field.value) : field)
            }
        }
        return .map(entries)
    }
}
