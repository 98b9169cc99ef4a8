#if canImport(Glibc)
    import Glibc
#endif
import Synchronization

/// What connections each remote address holds, and its failed authentications. `Sendable`; the tables
/// sit behind a `Mutex` and hold only addresses with open connections or recent failures (swept).
///
/// An address is its IPv4 address or its IPv6 /64 (one host or one site's network: a client with a
/// /64 has 2⁶⁴ addresses to rotate through, so the /64 is the unit every limit counts).
///
/// Four tallies:
/// - every accepted TCP connection (HTTP and WebSocket): refused at accept past the descriptor budget
///   (the process's open-file limit less a reserve for the upstream, NATS, SQLite and files), and past
///   ``RelayServerConfiguration/ConnectionLimits/pendingPerAddress`` connections of one address that
///   have not yet sent a request head or authenticated, and past ``RelayServerConfiguration/ConnectionLimits/pending``
///   of them from every address (so connections that never sign in, from however many addresses, leave
///   the rest of the connection budget to those that do);
/// - market and push WebSockets, in all and per address (refused the way Polygon refuses: a status and
///   close 1008);
/// - HTTP connections (their first request not an upgrade), in all and per address, so kept-alive
///   HTTP connections take at most a share of the descriptor budget (refused with a `503` and closed);
/// - failed authentications per address in the last window, which delay the answer to the next failure
///   (doubling, capped) but never refuse a correct key.
final class AddressGuard: Sendable {
    private struct State {
        /// Accepted connections per address, and of them those still pending.
        var accepted: [String: (open: Int, pending: Int)] = [:]
        var acceptedTotal = 0
        /// Of them, those still pending, from every address.
        var pendingTotal = 0
        /// Market and push WebSockets.
        var webSockets: [String: Int] = [:]
        var webSocketsTotal = 0
        /// HTTP connections.
        var http: [String: Int] = [:]
        var httpTotal = 0
        var failures: [String: (count: Int, last: ContinuousClock.Instant)] = [:]
        /// Failed authentications of each address whose (delayed) answer has not gone out yet.
        var failuresInFlight: [String: Int] = [:]
        var sweptAt: ContinuousClock.Instant?
    }

    /// Why a WebSocket is refused.
    enum Refusal: Sendable, Equatable {
        case total(Int)
        case perAddress(Int)
    }

    /// Why a connection is closed as soon as it is accepted.
    enum AcceptRefusal: Sendable, Equatable {
        case descriptors(Int)
        case pending(Int)
        /// Pending connections of every address together.
        case pendingInAll(Int)
        /// Open connections of the address, HTTP and WebSocket together (the per-address limit).
        case open(Int)
    }

    /// One accepted connection: its address, and whether it is still pending. Settled once.
    final class Ticket: Sendable {
        let address: String
        fileprivate let pending = Atomic<Bool>(true)
        /// Counted as an HTTP connection (``serveHTTP(_:)``) until it closes.
        fileprivate let http = Atomic<Bool>(false)

        fileprivate init(address: String) {
            self.address = address
        }
    }

    /// Failure records kept at most (an address past it is not delayed, never refused).
    static let maxFailureRecords = 65_536

    let limits: RelayServerConfiguration.ConnectionLimits
    /// Accepted connections at most: the open-file limit less the reserve.
    let descriptorBudget: Int
    /// HTTP connections at most: the setting, and at most a quarter of the descriptor budget (the rest
    /// stays for market clients whatever HTTP clients hold).
    let httpBudget: Int
    /// HTTP connections per address at most: the setting, and at most half of ``httpBudget`` (one
    /// address never holds them all).
    let httpPerAddress: Int
    /// Pending connections of every address together at most: the setting, and at most half of the
    /// descriptor budget (the other half stays for connections that sign in, whatever the limit).
    let pendingBudget: Int
    private let state = Mutex(State())

    init(limits: RelayServerConfiguration.ConnectionLimits, openFileLimit: Int = AddressGuard.openFileLimit()) {
        self.limits = limits
        descriptorBudget = openFileLimit > 0 ? max(openFileLimit - limits.descriptorReserve, 1) : Int.max
        httpBudget = min(limits.httpConnections, max(descriptorBudget / 4, 1))
        httpPerAddress = min(limits.httpConnectionsPerAddress, max(httpBudget / 2, 1))
        pendingBudget = min(limits.pending, max(descriptorBudget / 2, 1))
    }

    /// The address every limit counts: IPv4 as it is, IPv6 by its /64 (`2001:db8:1:2::/64`).
    static func key(for address: String) -> String {
        var v6 = in6_addr()
        guard address.contains(":"), inet_pton(AF_INET6, address, &v6) == 1 else { return address }
        let bytes = withUnsafeBytes(of: &v6) { Array($0) }
        // IPv4-mapped: the IPv4 address.
        if bytes[0..<10].allSatisfy({ $0 == 0 }), bytes[10] == 0xFF, bytes[11] == 0xFF {
            return bytes[12..<16].map(String.init).joined(separator: ".")
        }
        let groups = stride(from: 0, to: 8, by: 2).map { String(UInt16(bytes[$0]) << 8 | UInt16(bytes[$0 + 1]), radix: 16) }
        return groups.joined(separator: ":") + "::/64"
    }

    static func openFileLimit() -> Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur != rlim_t.max else { return -1 }
        return Int(clamping: limit.rlim_cur)
    }

    // MARK: every connection

    /// Counts a newly accepted connection (pending until ``settle(_:)``), or says why it is closed.
    func accept(_ address: String) -> (Ticket?, AcceptRefusal?) {
        let key = Self.key(for: address)
        return state.withLock { state in
            if state.acceptedTotal >= descriptorBudget { return (nil, .descriptors(descriptorBudget)) }
            let tally = state.accepted[key] ?? (0, 0)
            if tally.pending >= limits.pendingPerAddress { return (nil, .pending(limits.pendingPerAddress)) }
            if state.pendingTotal >= pendingBudget { return (nil, .pendingInAll(pendingBudget)) }
            // Room for the address's WebSockets and as many connections again as may be pending (so
            // one WebSocket past its limit still hears why, as Polygon tells it).
            let openLimit = limits.perAddress + limits.pendingPerAddress
            if tally.open >= openLimit { return (nil, .open(openLimit)) }
            state.accepted[key] = (tally.open + 1, tally.pending + 1)
            state.acceptedTotal += 1
            state.pendingTotal += 1
            return (Ticket(address: key), nil)
        }
    }

    /// The connection sent its first request head (HTTP) or authenticated (market WebSocket).
    func settle(_ ticket: Ticket) {
        guard ticket.pending.exchange(false, ordering: .acquiringAndReleasing) else { return }
        state.withLock { state in
            state.pendingTotal = max(state.pendingTotal - 1, 0)
            if let tally = state.accepted[ticket.address] { state.accepted[ticket.address] = (tally.open, max(tally.pending - 1, 0)) }
        }
    }

    /// The connection's first request is plain HTTP (asked once per connection, when it is known not to
    /// upgrade; a second ask counts nothing more): counts it as an HTTP connection until it closes, or
    /// says why it is refused (then it is answered so and closed, and not counted).
    func serveHTTP(_ ticket: Ticket) -> Refusal? {
        state.withLock { state in
            if ticket.http.load(ordering: .acquiring) { return nil }
            if state.httpTotal >= httpBudget { return .total(httpBudget) }
            if state.http[ticket.address, default: 0] >= httpPerAddress { return .perAddress(httpPerAddress) }
            ticket.http.store(true, ordering: .releasing)
            state.httpTotal += 1
            state.http[ticket.address, default: 0] += 1
            return nil
        }
    }

    /// The connection closed.
    func closed(_ ticket: Ticket) {
        let wasPending = ticket.pending.exchange(false, ordering: .acquiringAndReleasing)
        let wasHTTP = ticket.http.exchange(false, ordering: .acquiringAndReleasing)
        state.withLock { state in
            if wasHTTP {
                state.httpTotal = max(state.httpTotal - 1, 0)
                let left = (state.http[ticket.address] ?? 1) - 1
                state.http[ticket.address] = left > 0 ? left : nil
            }
            state.acceptedTotal = max(state.acceptedTotal - 1, 0)
            if wasPending { state.pendingTotal = max(state.pendingTotal - 1, 0) }
            guard let tally = state.accepted[ticket.address] else { return }
            let next = (open: tally.open - 1, pending: wasPending ? tally.pending - 1 : tally.pending)
            state.accepted[ticket.address] = next.open > 0 ? (next.open, max(next.pending, 0)) : nil
        }
    }

    /// Accepted connections now, and those of them pending, from `address` (tests, status).
    func accepted(from address: String) -> (open: Int, pending: Int) {
        state.withLock { $0.accepted[Self.key(for: address)] ?? (0, 0) }
    }

    /// Pending connections now, of every address (tests).
    var pendingInAll: Int { state.withLock { $0.pendingTotal } }

    /// HTTP connections now, of `address` and in all (tests).
    func httpConnections(of address: String) -> (address: Int, all: Int) {
        state.withLock { ($0.http[Self.key(for: address)] ?? 0, $0.httpTotal) }
    }

    // MARK: WebSockets

    /// Counts a new market or push WebSocket from `address`, or says why it is refused.
    func admit(_ address: String) -> Refusal? {
        let key = Self.key(for: address)
        return state.withLock { state in
            if state.webSocketsTotal >= limits.total { return .total(limits.total) }
            if state.webSockets[key, default: 0] >= limits.perAddress { return .perAddress(limits.perAddress) }
            state.webSocketsTotal += 1
            state.webSockets[key, default: 0] += 1
            return nil
        }
    }

    func release(_ address: String) {
        let key = Self.key(for: address)
        state.withLock { state in
            state.webSocketsTotal = max(state.webSocketsTotal - 1, 0)
            let left = (state.webSockets[key] ?? 1) - 1
            state.webSockets[key] = left > 0 ? left : nil
        }
    }

    // MARK: failed authentication

    /// Records a failed authentication from `address` and says how long to wait before answering it:
    /// nothing for the first in a window, then ``RelayServerConfiguration/ConnectionLimits/failureDelay``
    /// doubling with each further failure, at most ``RelayServerConfiguration/ConnectionLimits/maxFailureDelay``.
    /// A guesser gets few answers a second; a correct key is answered at once all the while.
    func failedAuthentication(from address: String, at now: ContinuousClock.Instant = .now) -> Duration {
        let key = Self.key(for: address)
        return state.withLock { record(failureOf: key, in: &$0, now: now) }
    }

    /// A wrong key presented on HTTP or a push-stream upgrade: its delay as ``failedAuthentication(from:at:)``
    /// gives it, or `nil` when the address is guessing (``isGuessing(_:)``; then not counted), asked
    /// and counted at once, so requests arriving together cannot all pass the check before any counts.
    func failedUnlessGuessing(from address: String, at now: ContinuousClock.Instant = .now) -> Duration? {
        let key = Self.key(for: address)
        return state.withLock { state in
            if state.failuresInFlight[key, default: 0] >= limits.failuresInFlightPerAddress { return nil }
            return record(failureOf: key, in: &state, now: now)
        }
    }

    private func record(failureOf key: String, in state: inout State, now: ContinuousClock.Instant) -> Duration {
        sweep(&state, now: now)
        var record = state.failures[key] ?? (0, now)
        if now - record.last >= limits.failureWindow { record.count = 0 }
        record.count += 1
        record.last = now
        if state.failures[key] != nil || state.failures.count < Self.maxFailureRecords { state.failures[key] = record }
        guard record.count > 1 else { return .zero }
        let doublings = min(record.count - 2, 30)
        state.failuresInFlight[key, default: 0] += 1
        return min(limits.failureDelay * (1 << doublings), limits.maxFailureDelay)
    }

    /// Gives a failed authentication its answer after `delay` (from ``failedUnlessGuessing(from:at:)``),
    /// its address's failure in flight until then.
    func answer<Answer>(after delay: Duration, failureOf address: String, _ answer: () async throws -> Answer) async rethrows -> Answer {
        guard delay > .zero else { return try await answer() }
        defer { failureAnswered(from: address) }
        // Cancelled (the server stopping): answered at once.
        try? await Task.sleep(for: delay)
        return try await answer()
    }

    /// A delayed failure's answer went out (call once for each non-zero delay given).
    func failureAnswered(from address: String) {
        let key = Self.key(for: address)
        state.withLock { state in
            let left = (state.failuresInFlight[key] ?? 1) - 1
            state.failuresInFlight[key] = left > 0 ? left : nil
        }
    }

    /// Whether `address` has as many delayed failure answers in flight as it may: a guesser opening
    /// connection after connection is then refused before its key is even checked (the right key too,
    /// but only while that many wrong ones from the same address are waiting for their answers).
    func isGuessing(_ address: String) -> Bool {
        let key = Self.key(for: address)
        return state.withLock { ($0.failuresInFlight[key] ?? 0) >= limits.failuresInFlightPerAddress }
    }

    /// Addresses with a failure record (tests).
    var failureRecords: Int { state.withLock { $0.failures.count } }

    /// Forgets failures older than the window, at most once per tenth of it.
    private func sweep(_ state: inout State, now: ContinuousClock.Instant) {
        if let sweptAt = state.sweptAt, now - sweptAt < limits.failureWindow / 10 { return }
        state.sweptAt = now
        let window = limits.failureWindow
        state.failures = state.failures.filter { now - $0.value.last < window }
    }
}
