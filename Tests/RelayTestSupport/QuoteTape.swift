import Tape

/// AAPL's quote numbered `n`, as the tests' tapes record it.
public func aaplQuote(_ n: Int) -> [UInt8] { Array(#"{"ev":"Q","sym":"AAPL","n":\#(n)}"#.utf8) }

/// `epoch` receiving AAPL quotes, then its quotes `sequences` (topic and market sequence alike), 1 ms
/// apart from `time`.
public func appendQuotes(to writer: TapeWriter, epoch: String, _ sequences: ClosedRange<Int>, at time: Int64) throws {
    try writer.append(.epoch(epoch, at: time))
    try writer.append(.holding(["Q.AAPL"], at: time))
    for index in sequences {
        try writer.append(
            .event(
                TapeEvent(
                    receivedAt: time + Int64(index) * 1_000_000, sequence: UInt64(index), topicSequence: UInt64(index), eventType: "Q",
                    ticker: "AAPL", bytes: aaplQuote(index))))
    }
}
