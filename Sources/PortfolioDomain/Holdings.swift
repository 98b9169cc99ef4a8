import Foundation

/// What kind of security a Polygon ticker names, from its prefix (`X:BTCUSD` is crypto).
public enum AssetType: String, Sendable, Codable, CaseIterable, Comparable {
    case stock, option, crypto, fx, index

    public init(ticker: String) {
        switch ticker.prefix(2) {
        case "O:": self = .option
        case "X:": self = .crypto
        case "C:": self = .fx
        case "I:": self = .index
        default: self = .stock
        }
    }

    public static func < (lhs: AssetType, rhs: AssetType) -> Bool { lhs.rawValue < rhs.rawValue }
}

/// One held security across the accounts asked for: the valuation's row, plus what lists need.
public struct Holding: Sendable, Equatable, Encodable {
    public var valuation: PositionValuation
    public var assetType: AssetType
    /// The accounts holding it, by id.
    public var accounts: [Int64]
    /// Percent of the priced total, 2 places; `nil` when unpriced or nothing is priced.
    public var weight: Decimal?

    public var symbol: String { valuation.symbol }

    enum CodingKeys: String, CodingKey { case assetType, accounts, weight }

    /// The valuation's row with the list's fields beside it, in one object.
    public func encode(to encoder: any Encoder) throws {
        try valuation.encode(to: encoder)
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(assetType, forKey: .assetType)
        try c.encode(accounts, forKey: .accounts)
        try c.encodeIfPresent(weight, forKey: .weight)
    }

    public init(valuation: PositionValuation, assetType: AssetType, accounts: [Int64], weight: Decimal?) {
        self.valuation = valuation
        self.assetType = assetType
        self.accounts = accounts
        self.weight = weight
    }
}

/// A list of holdings as a client asked for it: sorted, filtered, restricted to some accounts or asset
/// types. Value type, `Sendable`.
///
/// Each distinct list is a *view* with an id (``viewID``) that encodes the query itself, so a view
/// survives a restart of the relay and never needs to be registered first.
public struct HoldingsQuery: Sendable, Hashable, Encodable {
    public enum Field: String, Sendable, CaseIterable, Encodable {
        case symbol, assetType, quantity, price, marketValue, costBasis, unrealizedPnL, unrealizedPnLPercent, dayChange, weight

        /// Text fields sort A→Z by default, numbers largest first.
        var defaultOrder: Order { self == .symbol || self == .assetType ? .asc : .desc }
    }

    public enum Order: String, Sendable, CaseIterable, Encodable {
        case asc, desc
    }

    public var sort: Field
    public var order: Order
    /// Case-insensitive text the symbol must contain.
    public var filter: String?
    /// Empty: every type.
    public var assetTypes: Set<AssetType>
    /// Empty: every active brokerage account.
    public var accounts: Set<Int64>

    public init(
        sort: Field = .symbol, order: Order? = nil, filter: String? = nil, assetTypes: Set<AssetType> = [], accounts: Set<Int64> = []
    ) {
        self.sort = sort
        self.order = order ?? sort.defaultOrder
        let trimmed = filter?.trimmingCharacters(in: .whitespaces)
        self.filter = trimmed?.isEmpty ?? true ? nil : trimmed
        self.assetTypes = assetTypes
        self.accounts = accounts
    }

    enum CodingKeys: String, CodingKey { case sort, order, filter, assetTypes, accounts }

    /// The sets in order, so a view's JSON is the same each time.
    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(sort, forKey: .sort)
        try c.encode(order, forKey: .order)
        try c.encodeIfPresent(filter, forKey: .filter)
        try c.encode(assetTypes.sorted(), forKey: .assetTypes)
        try c.encode(accounts.sorted(), forKey: .accounts)
    }

    /// From query parameters `sort`, `order`, `filter`, `assetType` and `account` (the last two
    /// comma-separated lists); unknown values are refused naming the parameter.
    public init(parameters: [String: String]) throws(ValidationError) {
        func list(_ name: String) -> [String] {
            (parameters[name] ?? "").split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }
        var sort = Field.symbol
        if let text = parameters["sort"], !text.isEmpty {
            guard let field = Field(rawValue: text) else {
                throw .init(field: "sort", message: "one of \(Field.allCases.map(\.rawValue).joined(separator: ", ")), got \(text)")
            }
            sort = field
        }
        var order: Order?
        if let text = parameters["order"], !text.isEmpty {
            guard let value = Order(rawValue: text.lowercased()) else { throw .init(field: "order", message: "asc or desc, got \(text)") }
            order = value
        }
        var types: Set<AssetType> = []
        for text in list("assetType") {
            guard let type = AssetType(rawValue: text.lowercased()) else {
                throw .init(
                    field: "assetType", message: "one of \(AssetType.allCases.map(\.rawValue).joined(separator: ", ")), got \(text)")
            }
            types.insert(type)
        }
        var accounts: Set<Int64> = []
        for text in list("account") {
            guard let id = Int64(text) else { throw .init(field: "account", message: "account numbers, got \(text)") }
            accounts.insert(id)
        }
        self.init(sort: sort, order: order, filter: parameters["filter"], assetTypes: types, accounts: accounts)
    }

    /// The query as canonical parameters: equal queries give equal text.
    var canonical: [(String, String)] {
        var items = [("sort", sort.rawValue), ("order", order.rawValue)]
        if let filter { items.append(("filter", filter)) }
        if !assetTypes.isEmpty { items.append(("assetType", assetTypes.sorted().map(\.rawValue).joined(separator: ","))) }
        if !accounts.isEmpty { items.append(("account", accounts.sorted().map(String.init).joined(separator: ","))) }
        return items
    }

    /// The view's id: the canonical query, base64url-encoded.
    public var viewID: String {
        var components = URLComponents()
        components.queryItems = canonical.map { URLQueryItem(name: $0.0, value: $0.1) }
        return Data((components.percentEncodedQuery ?? "").utf8).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    /// The query a view id stands for.
    public init(viewID: String) throws(ValidationError) {
        var base64 = viewID.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        base64 += String(repeating: "=", count: (4 - base64.count % 4) % 4)
        guard let data = Data(base64Encoded: base64), let text = String(data: data, encoding: .utf8) else {
            throw .init(field: "view", message: "not a view id; list GET /v1/holdings for one")
        }
        var components = URLComponents()
        components.percentEncodedQuery = text
        var parameters: [String: String] = [:]
        for item in components.queryItems ?? [] { parameters[item.name] = item.value ?? "" }
        guard parameters["sort"] != nil else { throw .init(field: "view", message: "not a view id; list GET /v1/holdings for one") }
        do {
            try self.init(parameters: parameters)
        } catch {
            throw .init(field: "view", message: "not a view id (\(error.description))")
        }
    }

    /// The holdings this query keeps, in its order: ties, and values missing on both sides, broken by
    /// symbol A→Z; missing values (unpriced holdings) last whatever the order.
    public func apply(_ holdings: [Holding]) -> [Holding] {
        let needle = filter?.uppercased()
        let kept = holdings.filter { holding in
            (assetTypes.isEmpty || assetTypes.contains(holding.assetType))
                && (needle.map { holding.symbol.uppercased().contains($0) } ?? true)
        }
        return kept.sorted { a, b in
            switch (key(a), key(b)) {
            case (.number(let x?), .number(let y?)) where x != y: return order == .asc ? x < y : x > y
            case (.number(_?), .number(nil)): return true
            case (.number(nil), .number(_?)): return false
            case (.text(let x), .text(let y)) where x != y: return order == .asc ? x < y : x > y
            default: return a.symbol < b.symbol
            }
        }
    }

    enum Key {
        case number(Decimal?)
        case text(String)
    }

    func key(_ holding: Holding) -> Key {
        let v = holding.valuation
        return switch sort {
        case .symbol: .text(v.symbol)
        case .assetType: .text(holding.assetType.rawValue)
        case .quantity: .number(v.quantity)
        case .price: .number(v.price)
        case .marketValue: .number(v.marketValue)
        case .costBasis: .number(v.costBasis)
        case .unrealizedPnL: .number(v.unrealizedPnL)
        case .unrealizedPnLPercent: .number(v.unrealizedPnLPercent)
        case .dayChange: .number(v.dayChange)
        case .weight: .number(holding.weight)
        }
    }
}
