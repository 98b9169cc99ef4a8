/// A value that is well-formed but contradicts the account's life (dated before it was created, or on or
/// after it closed): answered 409 with the reason.
public struct ConflictError: Error, Sendable, Equatable, CustomStringConvertible {
    public var field: String
    public var message: String
    public var description: String { "\(field): \(message)" }

    public init(field: String, message: String) {
        self.field = field
        self.message = message
    }
}

/// A value that is refused, named so the caller can say which field is wrong: answered 422.
public struct ValidationError: Error, Sendable, Equatable, CustomStringConvertible {
    public var field: String
    public var message: String
    public var description: String { "\(field): \(message)" }

    public init(field: String, message: String) {
        self.field = field
        self.message = message
    }
}
