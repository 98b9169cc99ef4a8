/// A client's session tag (`KEY#tag`): what names a tagged session, whichever vendor's protocol the
/// client speaks: 1 to 64 letters, digits, `.`, `_` or `-`.
public enum SessionTag {
    public static func isValid(_ tag: String) -> Bool {
        (1...64).contains(tag.utf8.count)
            && tag.utf8.allSatisfy { byte in
                switch byte {
                case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                    UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "-"):
                    true
                default: false
                }
            }
    }
}
