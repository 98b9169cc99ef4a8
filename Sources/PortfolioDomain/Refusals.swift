/// A refusal that names the request field it is about, so a client can show it next to that field.
public protocol FieldRefusal: Error, CustomStringConvertible {
    var field: String { get }
    var message: String { get }
}

extension FieldRefusal {
    public var description: String { "\(field): \(message)" }
}

/// A value that is well-formed but contradicts the account's life (dated before it was created, or on or
/// after it closed): answered 409 with the reason.
public struct ConflictError: FieldRefusal, Sendable, Equatable {
    public var field: String
    public var message: String

    public init(field: String, message: String) {
        self.field = field
        self.message = message
    }
}

/// A value that is refused, named so the caller can say which field is wrong: answered 422.
public struct ValidationError: FieldRefusal, Sendable, Equatable {
    public var field: String
    public var message: String

    public init(field: String, message: String) {
        self.field = field
        self.message = message
    }
}
