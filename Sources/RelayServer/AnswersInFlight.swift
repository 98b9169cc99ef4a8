import CoreMetrics
import Hummingbird
import NIOCore
import Synchronization

/// The bytes of REST gateway answers the relay is sending, across every gateway and client, bounded
/// (`rest.answersInFlightMB`). A page of history may be tens of megabytes, and a client that asks for
/// one and does not read held all of it in the relay for as long as it liked; many such clients held
/// their sum. An answer's bytes count from when it is ready until its last piece went to the socket
/// (written in pieces, each waiting for the connection to take the one before, the last until NIO
/// has passed it to the socket), or the connection closed; an answer that would pass the bound is
/// refused with `503` and `Retry-After` instead. One answer alone is always sent, whatever its size,
/// when nothing else is in flight. A connection that makes no progress for ``pieceTimeout`` — its
/// head, a piece, or the end not taken — is closed: a client that stopped reading does not hold its
/// answer's bytes for as long as it keeps its socket open.
/// One body sent to several clients (a coalesced answer: the same buffer) counts once, as it is held
/// once.
///
/// `Sendable`: a `Mutex`.
final class AnswersInFlight: Sendable {
    let limit: Int
    private struct Held {
        var bytes = 0
        /// The bodies counted, by the address of their bytes: how large, and how many answers send it.
        var bodies: [UInt: (size: Int, answers: Int)] = [:]
    }

    private let held = Mutex(Held())
    private let gauge: Gauge?
    private let refusals: Counter?

    /// Answers below this size are sent whole and not counted: their bytes are a rounding error.
    static let countedFrom = 64 << 10
    /// How much of an answer goes to the connection at a time.
    static let piece = 64 << 10
    /// How long a connection may take to take one piece.
    static let pieceTimeout: TimeAmount = .seconds(30)

    init(limit: Int, factory: (any MetricsFactory)? = nil) {
        self.limit = max(limit, 1)
        gauge = factory.map { Gauge(label: "relay_rest_answer_bytes_in_flight", factory: $0) }
        refusals = factory.map { Counter(label: "relay_rest_answers_refused_total", factory: $0) }
    }

    /// The bytes counted now.
    var bytes: Int { held.withLock { $0.bytes } }

    /// Counts `body`'s bytes for an answer on `channel`, unless they would pass the bound while
    /// something else is counted (a body another answer is sending already costs nothing more, and is
    /// never refused). The bytes are counted until the returned value is released.
    func take(_ body: ByteBuffer, on channel: any Channel, stallTimeout: TimeAmount) -> Reservation? {
        let size = body.readableBytes
        let address = body.withUnsafeReadableBytes { UInt(bitPattern: $0.baseAddress) }
        let taken = held.withLock { held in
            if let counted = held.bodies[address], counted.size == size {
                held.bodies[address] = (size, counted.answers + 1)
                return true
            }
            guard held.bytes == 0 || held.bytes + size <= limit else { return false }
            held.bytes += size
            // An address counted with another size is another view of the bytes: counted on its own.
            if held.bodies[address] == nil { held.bodies[address] = (size, 1) }
            gauge?.record(held.bytes)
            return true
        }
        guard taken else {
            refusals?.increment()
            return nil
        }
        return Reservation(self, body, address: address, channel: channel, stallTimeout: stallTimeout)
    }

    private func give(_ size: Int, address: UInt) {
        held.withLock { held in
            if let counted = held.bodies[address], counted.size == size {
                guard counted.answers == 1 else {
                    held.bodies[address] = (size, counted.answers - 1)
                    return
                }
                held.bodies[address] = nil
            }
            held.bytes -= size
            gauge?.record(held.bytes)
        }
    }

    /// An answer's bytes while it is sent: given back when it goes (its body was written or dropped).
    /// It watches the connection from the start (the head is written before the body): each step of
    /// the answer must be taken within the stall timeout, else the connection is closed, which fails
    /// the write waiting on it and ends the body.
    final class Reservation: Sendable {
        private let owner: AnswersInFlight
        /// Held until the count is given back: its bytes' address is not reused while it is counted.
        private let body: ByteBuffer
        private let address: UInt
        var size: Int { body.readableBytes }
        private let channel: any Channel
        private let stallTimeout: TimeAmount
        private let watch = Mutex<Scheduled<Void>?>(nil)

        fileprivate init(_ owner: AnswersInFlight, _ body: ByteBuffer, address: UInt, channel: any Channel, stallTimeout: TimeAmount) {
            self.owner = owner
            self.body = body
            self.address = address
            self.channel = channel
            self.stallTimeout = stallTimeout
            progressed()
        }

        /// A step of the answer was taken: the next one has the whole stall timeout again.
        func progressed() {
            let channel = self.channel
            let next = channel.eventLoop.scheduleTask(in: stallTimeout) { channel.close(promise: nil) }
            watch.withLock { watch in
                watch?.cancel()
                watch = next
            }
        }

        /// The answer went whole: nothing more to watch.
        func finished() {
            watch.withLock { watch in
                watch?.cancel()
                watch = nil
            }
        }

        deinit {
            finished()
            owner.give(size, address: address)
        }
    }

    /// A response body for `body` on `channel`: whole when small; else counted (`nil` when the bound
    /// refuses it) and written a piece at a time, the count held until the body is written or dropped.
    func responseBody(_ body: ByteBuffer, on channel: any Channel, stallTimeout: TimeAmount = pieceTimeout) -> ResponseBody? {
        guard body.readableBytes >= Self.countedFrom else { return ResponseBody(byteBuffer: body) }
        guard let reservation = take(body, on: channel, stallTimeout: stallTimeout) else { return nil }
        return ResponseBody(contentLength: body.readableBytes) { writer in
            var rest = body
            while rest.readableBytes > 0, let piece = rest.readSlice(length: Swift.min(Self.piece, rest.readableBytes)) {
                reservation.progressed()
                try await writer.write(piece)
            }
            reservation.progressed()
            try await writer.finish(nil)
            // Handed over is not sent: what NIO still holds for the socket counts, and is watched,
            // until it has gone. The count is held for as long as this closure lives.
            await SocketByteCounter.written(on: channel)
            reservation.finished()
        }
    }
}
