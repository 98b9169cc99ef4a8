import NIOCore
import NIOEmbedded
import Testing

@testable import RelayServer

/// The bytes of gateway answers being sent: one body sent to several clients (a coalesced answer) is
/// held once and counted once; distinct bodies each count, up to the bound.
@Suite struct AnswersInFlightTests {
    @Test func aBodySentToSeveralClientsCountsOnce() throws {
        let answers = AnswersInFlight(limit: 1 << 20)
        let channel = EmbeddedChannel()
        let page = ByteBuffer(repeating: 7, count: 600 << 10)
        var reservations = (0..<5).compactMap { _ in answers.take(page, on: channel, stallTimeout: .seconds(30)) }
        #expect(reservations.count == 5, "the same 600 KiB five times fits a bound of 1 MiB: it is held once")
        #expect(answers.bytes == 600 << 10)
        let other = ByteBuffer(repeating: 8, count: 600 << 10)
        #expect(answers.take(other, on: channel, stallTimeout: .seconds(30)) == nil, "another 600 KiB would pass the bound")
        reservations.removeLast(4)
        #expect(answers.bytes == 600 << 10, "counted while any answer still sends it")
        reservations.removeAll()
        #expect(answers.bytes == 0)
        let taken = answers.take(other, on: channel, stallTimeout: .seconds(30))
        #expect(taken != nil && answers.bytes == 600 << 10)
    }

    @Test func aCopyOfTheBytesIsHeldAgainAndCountsAgain() throws {
        let answers = AnswersInFlight(limit: 1 << 20)
        let channel = EmbeddedChannel()
        let page = ByteBuffer(repeating: 7, count: 400 << 10)
        var copy = page
        copy.setBytes([9], at: 0)  // written: its own storage now
        let first = answers.take(page, on: channel, stallTimeout: .seconds(30))
        let second = answers.take(copy, on: channel, stallTimeout: .seconds(30))
        #expect(first != nil && second != nil)
        #expect(answers.bytes == 800 << 10)
        // A slice of the first page starts where it does but is smaller: counted on its own.
        let slice = page.getSlice(at: 0, length: 100 << 10)!
        let third = answers.take(slice, on: channel, stallTimeout: .seconds(30))
        #expect(third != nil && answers.bytes == 900 << 10)
        _ = (first, second, third)
    }
}
