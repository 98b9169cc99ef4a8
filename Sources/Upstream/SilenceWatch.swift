import CoreMetrics
import Foundation
import MarketCore

/// When a market trades, by a plain weekly calendar in New York time (no holidays: a holiday looks
/// like a silent upstream and is reconnected once, which is harmless). Pure, `Sendable`.
public enum MarketHours {
    /// Whether events are expected from `market` at `date`: crypto always; stocks on weekdays
    /// 04:00–20:00 (extended hours); options and indices on weekdays 09:30–16:00; forex and futures from
    /// Sunday 17:00 to Friday 17:00, less futures' daily 17:00–18:00 pause. News never: an hour without
    /// a story is no silence.
    public static func isOpen(_ market: Market, at date: Date) -> Bool {
        guard market != .crypto else { return true }
        guard market != .news else { return false }
        var calendar = Calendar(identifier: .gregorian)
        guard let zone = TimeZone(identifier: "America/New_York") else { return true }
        calendar.timeZone = zone
        let parts = calendar.dateComponents([.weekday, .hour, .minute], from: date)
        guard let weekday = parts.weekday, let hour = parts.hour, let minute = parts.minute else { return true }
        let minutes = hour * 60 + minute
        let weekdays = (2...6).contains(weekday)  // Monday … Friday
        switch market {
        case .crypto: return true
        case .news: return false
        case .stocks: return weekdays && (4 * 60..<20 * 60).contains(minutes)
        case .options, .indices: return weekdays && (9 * 60 + 30..<16 * 60).contains(minutes)
        case .forex, .futures:
            if weekday == 7 { return false }  // Saturday
            if weekday == 1 { return minutes >= 17 * 60 }  // Sunday evening on
            if weekday == 6 { return minutes < 17 * 60 }  // Friday until 17:00
            return market == .forex || !(17 * 60..<18 * 60).contains(minutes)
        }
    }
}

/// A silent upstream: connected and authenticated, answering pings, topics subscribed, the market open,
/// and yet no event for ``UpstreamConfiguration/silentAfter``. Seen, it is shown (the
/// `relay_upstream_silent` gauge, `/healthz`) and the connection is dropped once, so the reconnect asks
/// for everything again; if the new connection is silent too it is left alone (and still shown) until an
/// event arrives. A value type the client's watch task owns.
struct SilenceWatch {
    let after: Duration
    let market: Market?
    /// Events received when last looked, and since when that count has stood.
    private var events = -1
    private var since = ContinuousClock.now
    /// Silent now; and whether this silence was already answered with a reconnect.
    private(set) var silent = false
    private var reconnected = false

    init(after: Duration, market: Market?) {
        self.after = after
        self.market = market
    }

    enum Verdict: Equatable {
        /// Events come, or none are expected.
        case quiet
        /// Silent, and already reconnected once for it.
        case silent
        /// Silent for the first time since the last event: drop the connection.
        case reconnect
        /// An event ended a silence.
        case recovered
    }

    /// One look: the connection's state, its subscribed topics, its events so far.
    mutating func look(authenticated: Bool, subscribed: Int, events count: Int, now: ContinuousClock.Instant, date: Date) -> Verdict {
        if count != events {
            // An event arrived: the clock starts again, and a later silence may be answered again.
            let first = events == -1
            events = count
            since = now
            reconnected = false
            if silent, !first {
                silent = false
                return .recovered
            }
            return .quiet
        }
        let expected = authenticated && subscribed > 0 && (market.map { MarketHours.isOpen($0, at: date) } ?? true)
        guard expected else {
            // Reconnecting, nothing subscribed, or the market closed: no silence counts meanwhile.
            since = now
            silent = false
            return .quiet
        }
        guard now - since >= after else { return silent ? .silent : .quiet }
        silent = true
        guard reconnected else {
            reconnected = true
            since = now
            return .reconnect
        }
        return .silent
    }
}
