import NIOCore
import PolygonWire
import Synchronization

/// What one demo market generated: each trade, quote and minute bar as a compact record, for
/// ``DemoFeed``'s REST answers (`/v3/trades`, `/v3/quotes`, minute aggregates) to match what it streamed
/// event by event, whether or not anybody was connected. Kept for ``retention`` (30 minutes), and at
/// most ``capacity`` records (at the default rates 30 minutes of stocks take about 0.9 M records, 36 MB);
/// the oldest go first.
///
/// `Sendable` behind a `Mutex`; records arrive in time order, so a window is found by binary search.
final class DemoTape: Sendable {
    /// One trade or quote in 40 bytes: prices in the market's units, sizes as generated.
    struct Record: Sendable, Equatable {
        enum Kind: UInt8, Sendable {
            case trade, quote
        }

        /// Unix ms (`t`).
        var time: Int64
        /// `q` (and the trade's `i`).
        var sequence: Int64
        /// Trade price, or the quote's bid (forex: the mid it moves around).
        var price: Int32
        /// The quote's ask (unused for trades).
        var ask: Int32
        /// Trade size, or the bid size.
        var size: Int16
        var askSize: Int16
        var ticker: UInt16
        var kind: Kind
        var exchange: UInt8
        var askExchange: UInt8
    }

    /// A minute (or interval) bar as the feed streamed it.
    struct Bar: Sendable, Equatable {
        var ticker: UInt16
        var start: Int64
        var end: Int64
        var open, high, low, close: Int64
        var volume: Int64
        var vwap: Int64
        var trades: Int
    }

    static let retention: Int64 = 30 * 60_000
    let capacity: Int
    let market: Market
    private struct State {
        var records = CircularBuffer<Record>()
        var bars = CircularBuffer<Bar>()
        var tickers: [String] = []
        var index: [String: UInt16] = [:]
    }

    private let state = Mutex(State())

    init(market: Market, capacity: Int = 2_000_000) {
        self.market = market
        self.capacity = capacity
    }

    /// The universe's tickers, in the order records name them by.
    func setTickers(_ tickers: [String]) {
        state.withLock { state in
            state.tickers = tickers
            state.index = Dictionary(tickers.enumerated().map { (Self.key($0.element), UInt16($0.offset)) }, uniquingKeysWith: { first, _ in first })
        }
    }

    func append(_ records: [Record], bars: [Bar], now: Int64) {
        guard !records.isEmpty || !bars.isEmpty else { return }
        state.withLock { state in
            state.records.append(contentsOf: records)
            state.bars.append(contentsOf: bars)
            let horizon = now - Self.retention
            while let first = state.records.first, first.time < horizon || state.records.count > capacity { state.records.removeFirst() }
            while let first = state.bars.first, first.end < horizon { state.bars.removeFirst() }
        }
    }

    /// A ticker as REST and topics may spell it (`X:BTCUSD`, `X:BTC-USD`, `C:EUR/USD`): the same key.
    static func key(_ ticker: some StringProtocol) -> String {
        String(ticker.uppercased().filter { $0 != "-" && $0 != "/" })
    }

    /// The ticker's number in this tape, if it is of this market's universe.
    func ticker(_ name: String) -> UInt16? { state.withLock { $0.index[Self.key(name)] } }

    /// The topic-form name of a ticker number.
    func name(_ ticker: UInt16) -> String { state.withLock { state in Int(ticker) < state.tickers.count ? state.tickers[Int(ticker)] : "" } }

    /// The records of `ticker` and `kind` with `from <= time < to` (Unix ms), oldest first.
    func records(_ kind: Record.Kind, ticker: UInt16, from: Int64, to: Int64) -> [Record] {
        state.withLock { state in
            let records = state.records
            // The first record at or after `from`.
            var low = records.startIndex
            var count = records.count
            while count > 0 {
                let half = count / 2
                let middle = records.index(low, offsetBy: half)
                if records[middle].time < from {
                    low = records.index(after: middle)
                    count -= half + 1
                } else {
                    count = half
                }
            }
            var found: [Record] = []
            var position = low
            while position != records.endIndex, records[position].time < to {
                let record = records[position]
                if record.ticker == ticker, record.kind == kind { found.append(record) }
                position = records.index(after: position)
            }
            return found
        }
    }

    /// The bars of `ticker` starting within `from...to` (Unix ms), oldest first.
    func bars(ticker: UInt16, from: Int64, through to: Int64) -> [Bar] {
        state.withLock { state in state.bars.filter { $0.ticker == ticker && $0.start >= from && $0.start <= to } }
    }

    /// The oldest record kept (Unix ms), if any.
    var oldest: Int64? { state.withLock { $0.records.first?.time } }
}
