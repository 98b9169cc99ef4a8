/// Which neighbours of the security being viewed to prefetch, and when. Pure, `Sendable`.
///
/// Viewing position `n` of a list: `n−1` and `n+1` at once, `n−2` and `n+2` after a pause; positions
/// outside the list are skipped, and nothing is listed twice (a list of two has one neighbour).
public struct PrefetchWindow: Sendable, Equatable {
    /// Symbols to prefetch now, nearest first.
    public var immediate: [String]
    /// Symbols to prefetch after the delay.
    public var delayed: [String]

    /// Everything the window covers, the viewed symbol included: prefetches outside it are cancelled.
    public var covered: Set<String>

    public static let delay: Duration = .milliseconds(500)

    public init(order: [String], viewing index: Int) {
        guard order.indices.contains(index) else {
            immediate = []
            delayed = []
            covered = []
            return
        }
        func at(_ offset: Int) -> String? {
            let position = index + offset
            return order.indices.contains(position) ? order[position] : nil
        }
        let viewed = order[index]
        var seen: Set<String> = [viewed]
        func pick(_ offsets: [Int]) -> [String] {
            offsets.compactMap(at).filter { seen.insert($0).inserted }
        }
        immediate = pick([-1, 1])
        delayed = pick([-2, 2])
        covered = seen
    }

    /// The first security of a list that was just loaded, sorted or filtered: worth loading ahead.
    public static func firstOf(_ order: [String]) -> String? { order.first }
}
