/// Text from outside the process that a client, a log or a status may show (a vendor's error message,
/// a cluster notice's reason): whoever sends it chooses it, so it is bounded and printable before it is
/// kept or told. Pure, `Sendable`.
public enum VisibleText {
    /// The most UTF-8 bytes kept of a vendor's status or error text: what a log, `/healthz` and every
    /// client told of it carry.
    public static let vendorBytes = 256

    /// `text` as a client may see it: every control, format, separator (other than a plain space),
    /// private-use or unassigned scalar becomes one space (runs of them one space), the ends trimmed,
    /// and at most `limit` UTF-8 bytes, cut between characters with `…` when cut.
    public static func visible(_ text: some StringProtocol, limit: Int) -> String {
        var cleaned = String.UnicodeScalarView()
        var pendingSpace = false
        // Reading stops well past the limit: a 200 KB message costs no more than a short one.
        var read = 0
        for scalar in text.unicodeScalars {
            read += 1
            if read > limit * 4 { break }
            if isVisible(scalar) {
                if pendingSpace, !cleaned.isEmpty { cleaned.append(" ") }
                pendingSpace = false
                cleaned.append(scalar)
            } else {
                pendingSpace = true
            }
        }
        let whole = String(cleaned)
        guard whole.utf8.count > limit || read > limit * 4 else { return whole }
        let ellipsis = "…"
        var cut = ""
        for character in whole {
            guard cut.utf8.count + character.utf8.count + ellipsis.utf8.count <= limit else { break }
            cut.append(character)
        }
        return cut + ellipsis
    }

    /// Letters, marks, numbers, punctuation, symbols and the plain space.
    public static func isVisible(_ scalar: Unicode.Scalar) -> Bool {
        if scalar == " " { return true }
        switch scalar.properties.generalCategory {
        case .uppercaseLetter, .lowercaseLetter, .titlecaseLetter, .modifierLetter, .otherLetter,
            .nonspacingMark, .spacingMark, .enclosingMark,
            .decimalNumber, .letterNumber, .otherNumber,
            .connectorPunctuation, .dashPunctuation, .openPunctuation, .closePunctuation, .initialPunctuation, .finalPunctuation,
            .otherPunctuation,
            .mathSymbol, .currencySymbol, .modifierSymbol, .otherSymbol:
            return true
        default:
            return false
        }
    }
}
