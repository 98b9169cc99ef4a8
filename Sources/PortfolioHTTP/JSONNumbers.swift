import Portfolio
/// A scan of a JSON document's numbers, for what `JSONDecoder` hides: whether one was written with an
/// exponent. Pure; reads the bytes once and never fails (malformed JSON is the decoder's to report).
enum JSONNumbers {
    /// The key of the first number written with an exponent (`1e3`, `2.5E-1`), `""` at the top level
    /// or in an array, or `nil` when there is none.
    static func fieldWithExponent(in bytes: some Collection<UInt8>) -> String? {
        var inString = false
        var escaped = false
        var text: [UInt8] = []
        var lastString = ""
        var key = ""
        var inNumber = false
        for byte in bytes {
            if inString {
                if escaped {
                    escaped = false
                    text.append(byte)
                } else if byte == UInt8(ascii: "\\") {
                    escaped = true
                } else if byte == UInt8(ascii: "\"") {
                    inString = false
                    lastString = String(decoding: text, as: UTF8.self)
                } else {
                    text.append(byte)
                }
                continue
            }
            switch byte {
            case UInt8(ascii: "\""):
                inString = true
                inNumber = false
                text = []
            case UInt8(ascii: ":"):
                key = lastString
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
                inNumber = true
            case UInt8(ascii: "e"), UInt8(ascii: "E"):
                if inNumber { return key }
            case UInt8(ascii: "."), UInt8(ascii: "+"):
                break
            default:
                inNumber = false
                if byte == UInt8(ascii: "[") || byte == UInt8(ascii: "{") { key = "" }
            }
        }
        return nil
    }
}
