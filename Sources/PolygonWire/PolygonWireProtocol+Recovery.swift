import MarketCore

extension PolygonWireProtocol {
    /// `q` for trades and quotes (rising per ticker), the bar's start `s` for minute bars, else the time `t`.
    public func recoveryOrder(of eventType: String) -> RecoveryOrder {
        switch eventType {
        case "T", "Q": .sequence
        case "AM", "XA", "CA": .barStart
        default: .time
        }
    }

    /// The integer value of the order's field in the event's JSON (`q`, `s`, `t`), if present.
    public func orderValue(_ order: RecoveryOrder, of event: MarketEvent) -> Int64? {
        let view = event.bytes.readableBytesView
        let key = Array("\"\(order.rawValue)\":".utf8)
        var index = view.startIndex
        while let found = view[index...].firstRange(of: key)?.lowerBound {
            // A key, not the tail of a longer one or a string's content: `{` or `,` comes before it.
            let before = found > view.startIndex ? view[view.index(before: found)] : UInt8(ascii: "{")
            var position = found + key.count
            if before == UInt8(ascii: "{") || before == UInt8(ascii: ",") {
                var negative = false
                if position < view.endIndex, view[position] == UInt8(ascii: "-") {
                    negative = true
                    position += 1
                }
                var value: Int64 = 0
                var digits = 0
                while position < view.endIndex, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(view[position]), digits < 18 {
                    value = value * 10 + Int64(view[position] - UInt8(ascii: "0"))
                    position += 1
                    digits += 1
                }
                if digits > 0 { return negative ? -value : value }
            }
            index = found + 1
        }
        return nil
    }
}
