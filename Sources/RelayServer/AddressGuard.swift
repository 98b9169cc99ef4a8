import Synchronization

/// Connection limits by remote address, and failed authentication per address. `Sendable`; the
/// tables sit behind a `Mutex` and hold only addresses with open connections or recent failures.
final class AddressGuard: Sendable {
    private struct State {
        var open: [String: Int] = [:]
        var total = 0
        var failures: [String: [ContinuousClock.Instant]] = [:]
    }

    /// Why a connection is refused.
    enum Refusal: Sendable, Equatable {
        case total(Int)
        case perAddress(Int)
        case tooManyFailures(retryAfter: Duration)
    }

    let limits: RelayServerConfiguration.ConnectionLimits
    private let state = Mutex(State())

    init(limits: RelayServerConfiguration.ConnectionLimits) {
        self.limits = limits
    }

    /// Counts a new connection from `address`, or says why it is refused.
    func admit(_ address: String, at now: ContinuousClock.Instant = .now) -> Refusal? {
        state.withLock { state in
            let recent = (state.failures[address] ?? []).filter { now - $0 < limits.failureWindow }
            state.failures[address] = recent.isEmpty ? nil : recent
            if recent.count >= limits.failedAuthentications, let oldest = recent.first {
                return .tooManyFailures(retryAfter: limits.failureWindow - (now - oldest))
            }
            if state.total >= limits.total { return .total(limits.total) }
            if state.open[address, default: 0] >= limits.perAddress { return .perAddress(limits.perAddress) }
            state.total += 1
            state.open[address, default: 0] += 1
            return nil
        }
    }

    func release(_ address: String) {
        state.withLock { state in
            state.total = max(state.total - 1, 0)
            let left = (state.open[address] ?? 1) - 1
            state.open[address] = left > 0 ? left : nil
        }
    }

    func failedAuthentication(from address: String, at now: ContinuousClock.Instant = .now) {
        state.withLock { $0.failures[address, default: []].append(now) }
    }
}
