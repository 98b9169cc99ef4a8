import NIOCore
import MarketCore

/// Events of an Alpaca hub as a client's frames, in its codec. Each event's bytes are its MessagePack
/// map as the upstream sent it: a MessagePack client gets them under a new array header, unchanged; a
/// JSON client gets each written as Alpaca's JSON. The relay's own notices are maps too (rendered by
/// ``AlpacaWireProtocol/render(_:)``), each alone in its frame. Pure.
///
/// Framing is two steps, so the costly one can be shared: ``element(_:codec:)`` makes one event's
/// element of an array in the codec (for JSON a conversion, which the relay makes once per event of a
/// publish and shares among its JSON clients), and ``payloads(elements:codec:maxFrameBytes:)`` joins a
/// client's elements into frames.
public enum AlpacaDelivery {
    /// One event's element of a frame's array, in a codec, and whether it must be alone in its frame.
    public struct Element: Sendable {
        public let bytes: ByteBuffer
        public let isNotice: Bool

        public init(bytes: ByteBuffer, isNotice: Bool) {
            self.bytes = bytes
            self.isNotice = isNotice
        }
    }

    /// An event's element in `codec`: a MessagePack event's (or notice's) own bytes, or its JSON.
    /// `nil`: an event whose bytes are not one MessagePack value (the hub only holds checked ones).
    public static func element(_ event: borrowing MarketEvent, codec: AlpacaCodec) -> Element? {
        elementBytes(event, codec: codec).map { Element(bytes: $0, isNotice: event.isNotice) }
    }

    /// The bytes of ``element(_:codec:)``: what a hub keeps per event of a publish for its JSON clients.
    public static func elementBytes(_ event: borrowing MarketEvent, codec: AlpacaCodec) -> ByteBuffer? {
        switch codec {
        case .messagePack:
            return event.bytes
        case .json:
            guard let value = try? MessagePack.decode(event.bytes.readableBytesView) else { return nil }
            return ByteBuffer(bytes: AlpacaJSON.text(value))
        }
    }

    /// Frame payloads for `events`, in order (each converted here: for one client).
    public static func payloads(_ events: [MarketEvent], codec: AlpacaCodec, maxFrameBytes: Int = FrameEncoder.maxFrameBytes) -> [ByteBuffer] {
        payloads(elements: events.compactMap { element($0, codec: codec) }, codec: codec, maxFrameBytes: maxFrameBytes)
    }

    /// Frame payloads joining `elements`, in order, none past `maxFrameBytes` unless one element is;
    /// each notice alone in its frame.
    public static func payloads(elements: [Element], codec: AlpacaCodec, maxFrameBytes: Int = FrameEncoder.maxFrameBytes) -> [ByteBuffer] {
        // What a frame adds to its elements: the array header (at most 5 bytes), or JSON's brackets.
        let framing = 5
        var payloads: [ByteBuffer] = []
        var run: [ByteBuffer] = []
        var runBytes = framing
        func flush() {
            guard !run.isEmpty else { return }
            payloads.append(frame(run, codec: codec))
            run.removeAll(keepingCapacity: true)
            runBytes = framing
        }
        for element in elements {
            if element.isNotice {
                flush()
                payloads.append(frame([element.bytes], codec: codec))
                continue
            }
            if runBytes + element.bytes.readableBytes + 1 > maxFrameBytes { flush() }
            run.append(element.bytes)
            runBytes += element.bytes.readableBytes + 1
        }
        flush()
        return payloads
    }

    /// Elements under one array: a MessagePack array header, or JSON's brackets and commas.
    private static func frame(_ elements: [ByteBuffer], codec: AlpacaCodec) -> ByteBuffer {
        let size = elements.reduce(0) { $0 + $1.readableBytes + 1 }
        switch codec {
        case .messagePack:
            var writer = MessagePack.Writer(capacity: 5 + size)
            writer.arrayHeader(elements.count)
            for element in elements { writer.raw(element.readableBytesView) }
            return ByteBuffer(bytes: writer.bytes)
        case .json:
            var out = ByteBuffer()
            out.reserveCapacity(size + 1)
            out.writeInteger(UInt8(ascii: "["))
            for (index, element) in elements.enumerated() {
                if index > 0 { out.writeInteger(UInt8(ascii: ",")) }
                out.writeImmutableBuffer(element)
            }
            out.writeInteger(UInt8(ascii: "]"))
            return out
        }
    }
}
