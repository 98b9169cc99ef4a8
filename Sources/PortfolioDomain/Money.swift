import Foundation

/// Exact decimal text for money and quantities: what the API accepts and what the database stores.
///
/// Only plain decimals are accepted (`12`, `-0.5`, `1234.5678`): no exponents, grouping, NaN or
/// locale separators, so a value means the same everywhere and round-trips byte for byte.
public enum DecimalText {
    private static let posix = Locale(identifier: "en_US_POSIX")

    /// Parses a plain decimal string; `nil` for anything else.
    public static func parse(_ text: String) -> Decimal? {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        guard isPlainDecimal(trimmed.utf8) else { return nil }
        return Decimal(string: trimmed, locale: posix)
    }

    /// `-?[0-9]{1,30}(\.[0-9]{1,18})?`, at most 38 digits in all (what a `Decimal` holds exactly: past
    /// it the parser drops digits, and `1e29` plus a millionth of a millionth would read as 201), checked
    /// byte by byte (a regular expression per call was a third of a large import's time).
    static func isPlainDecimal(_ bytes: String.UTF8View) -> Bool {
        var digits = 0
        var fraction: Int?
        for (offset, byte) in bytes.enumerated() {
            switch byte {
            case UInt8(ascii: "-") where offset == 0:
                continue
            case UInt8(ascii: "0")...UInt8(ascii: "9"):
                if let count = fraction { fraction = count + 1 } else { digits += 1 }
            case UInt8(ascii: ".") where fraction == nil && digits > 0:
                fraction = 0
            default:
                return false
            }
        }
        return (1...30).contains(digits) && (fraction.map { (1...18).contains($0) } ?? true) && digits + (fraction ?? 0) <= 38
    }

    /// The canonical text of a value (`0.3`, `-12.5`, `100`).
    public static func format(_ value: Decimal) -> String {
        var copy = value
        return NSDecimalString(&copy, posix)
    }

    /// `value` rounded half-even to `scale` decimal places (at most 18) when its text is one ``parse(_:)``
    /// reads back (at most 30 digits before the point; not NaN, what an overflow makes), else `nil`: what
    /// the store writes, so that everything it writes it can read (a price from a REST host, or a product
    /// of a quantity and a price, may have more places or digits than that).
    public static func storable(_ value: Decimal, scale: Int) -> Decimal? {
        guard !value.isNaN else { return nil }
        let kept = rounded(value, scale: min(scale, 18))
        return isPlainDecimal(format(kept).utf8) ? kept : nil
    }

    /// A value rounded half-even to `scale` decimal places (display and ratios, never stored sums).
    public static func rounded(_ value: Decimal, scale: Int) -> Decimal {
        var input = value
        var output = Decimal()
        NSDecimalRound(&output, &input, scale, .bankers)
        return output
    }
}
