import NIOCore
import NIOWebSocket
import MarketCore

/// What a downstream WebSocket connection does with its messages: the market feed's Polygon
/// conversation, or a server-push stream. Called on the connection's event loop, synchronously.
struct WebSocketConversation {
    /// The connection is open and upgraded (the handler is in the pipeline and may write).
    var opened: () -> Void
    /// One whole client message (text or binary; fragments already joined).
    var received: (ByteBuffer) -> Void
    /// The connection is gone (once, whoever closed it).
    var closed: () -> Void
}

/// The channel handler of one downstream WebSocket connection once upgraded. It answers pings, pings a
/// quiet client and drops one that stops answering, runs the close handshake in both directions, tracks
/// writability for the code that writes, joins fragments into messages (up to the connection's
/// ``ClientMessageLimit``) and hands each client message to its ``WebSocketConversation``.
///
/// What a client can make it hold is bounded: while the connection is not writable it reads nothing
/// more from the client (so a client that sends and never reads fills its own socket, not our memory),
/// and a client that sends frames of any kind (pings too) faster than its pace (``InboundPace``) is not
/// read until the pace allows more, so what a flood costs in CPU is bounded as well;
/// at most one pong waits to be written; and a connection whose unsent bytes pass
/// ``RelayServerConfiguration/ConnectionLimits/outboundBytes`` is told so and closed (1008).
///
/// Event-loop confined like every NIO handler (not `Sendable`): code elsewhere reaches it through
/// `NIOLoopBound`: the connection's actor, whose executor is the same loop (``MarketConnection``), and
/// its loop's ``LoopDrain``, which writes what the hub queued for the client. No task per connection reads: NIO calls ``channelRead``.
final class WebSocketConnectionHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = WebSocketFrame
    typealias OutboundOut = WebSocketFrame

    private var context: ChannelHandlerContext?
    private var conversation: WebSocketConversation?
    /// How an error is told to this client: its protocol's error frame (a market connection's session
    /// sets it), else the relay's own status object.
    var errorFrame: (DownstreamError) -> (payload: ByteBuffer, binary: Bool) = { (RelayStatus.frame(status: "error", message: $0.message), false) }
    /// What went to the socket in all (`nil` when the pipeline has no counter).
    var socketCounter: (any SocketBytes)?
    /// A tagged session's acknowledged position, noted after each write of events.
    var acknowledgedPosition: AcknowledgedPosition?
    /// Its loop's ping deadlines: the handler is in it while open, once per interval.
    private let pings: LoopDeadlineQueue<WebSocketConnectionHandler>
    private let closeTimeout: TimeAmount
    private var awaitingPong = false
    /// A close frame was sent; the channel closes when the client answers or after `closeTimeout`.
    private(set) var isClosing = false
    private var isClosed = false
    /// Shared with the task that drains this client's hub stream; the frames it may have handed the
    /// loop and not yet written are bound by the outbound limit too.
    let writability: Writability
    /// Where whole frames go (``writeWire(_:)``); set before the handler is added.
    private var outlet: WireGate?
    /// The largest message accepted now (shared with the connection's ``WireGate``).
    let messageLimit: ClientMessageLimit
    /// Unsent bytes past which the client is closed.
    private let outboundLimit: Int
    /// The fragments of a message not yet finished, and how many.
    private var fragments: ByteBuffer?
    private var fragmentCount = 0
    /// A pong is written and not yet sent; the payload of a ping that came meanwhile (answered after).
    private var pongInFlight = false
    private var pongWaiting: ByteBuffer?

    /// Fragments of one message at most.
    static let maxFragments = 1024

    /// The frames a client may send: a burst, then a sustained rate.
    struct InboundPace {
        var perSecond: Int
        var burst: Int
    }

    private let pace: InboundPace
    private var tokens: Double
    private var filledAt: NIODeadline?
    /// Reading is paused until the pace allows more (or resumed by a scheduled task).
    private var throttled = false
    /// Reading is paused while the connection's hub changes are backlogged (``holdReading(_:)``).
    private var backlogged = false
    /// Reading was paused by the relay (backlogged or throttled) since the last ping deadline: a pong
    /// may still be waiting behind what the client sent meanwhile.
    private var heldSinceDeadline = false
    private var writable = true
    /// Reading was paused because the client's socket took nothing more (not writable) since the last
    /// ping deadline; whether it was so at that deadline, and whether it took bytes again since: a
    /// client that reads slowly has its pong waiting too; one whose socket stayed full for the whole
    /// interval is not spared for it.
    private var unwritableSinceDeadline = false
    private var unwritableAtDeadline = false
    private var drainedSinceDeadline = false

    init(
        pings: LoopDeadlineQueue<WebSocketConnectionHandler>, closeTimeout: TimeAmount, messageLimit: ClientMessageLimit, outboundLimit: Int,
        pace: InboundPace
    ) {
        self.pings = pings
        self.closeTimeout = closeTimeout
        self.messageLimit = messageLimit
        self.outboundLimit = outboundLimit
        writability = Writability(inFlightLimit: outboundLimit)
        self.pace = InboundPace(perSecond: max(pace.perSecond, 1), burst: max(pace.burst, 1))
        tokens = Double(self.pace.burst)
    }

    /// Set once, before the handler is added to the pipeline (the conversation needs the handler to
    /// write, the handler needs the conversation to deliver).
    func attach(_ conversation: WebSocketConversation) {
        self.conversation = conversation
    }

    /// Set once, before the handler is added: the outlet ``writeWire(_:)`` writes through.
    func attach(_ outlet: WireGate) {
        self.outlet = outlet
    }

    var isWritable: Bool { context?.channel.isWritable ?? false }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        pings.add(self)
        // Added by the upgrade, to a channel that is already active.
        conversation?.opened()
    }

    func channelInactive(context: ChannelHandlerContext) {
        finish()
        context.fireChannelInactive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        finish()
        self.context = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = unwrapInboundIn(data)
        takeToken(context)
        switch frame.opcode {
        case .text, .binary:
            guard !isClosing else { return }
            guard fragments == nil else { return close(code: .protocolError, reason: "a new message inside a fragmented one") }
            if frame.fin {
                conversation?.received(frame.unmaskedData)
            } else {
                fragments = frame.unmaskedData
                fragmentCount = 1
                checkFragments()
            }
        case .continuation:
            guard !isClosing else { return }
            guard var joined = fragments else { return close(code: .protocolError, reason: "a continuation without a message") }
            fragments = nil
            var data = frame.unmaskedData
            guard joined.readableBytes + data.readableBytes <= messageLimit.bytes else { return tooLarge() }
            joined.writeBuffer(&data)
            fragmentCount += 1
            if frame.fin {
                fragmentCount = 0
                conversation?.received(joined)
            } else {
                fragments = joined
                checkFragments()
            }
        case .ping:
            guard !isClosing else { return }
            pong(frame.unmaskedData)
        case .pong:
            awaitingPong = false
        case .connectionClose:
            if isClosing {
                // The answer to our close: done.
                context.close(promise: nil)
            } else {
                // The client closes: answer with its code, then close.
                isClosing = true
                var data = frame.unmaskedData
                let code = data.readWebSocketErrorCode() ?? .normalClosure
                var reply = context.channel.allocator.buffer(capacity: 2)
                reply.write(webSocketErrorCode: code)
                let channel = context.channel
                context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .connectionClose, data: reply)))
                    .whenComplete { _ in channel.close(promise: nil) }
                // A client that reads nothing more never takes the answer: closed anyway after the close
                // timeout (its connection, slot and session would be held for good).
                closeAtTheLatest(in: closeTimeout, context: context)
            }
        default:
            break
        }
    }

    /// The client closed its side of TCP without a close frame (Hummingbird allows half-closed
    /// channels): nothing more can come, so the connection ends now rather than at the next missed
    /// ping, giving back its key's connection slot, its address's count and its tagged session at once.
    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? ChannelEvent, event == .inputClosed {
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A protocol error (bad frame, oversized message): tell the client the way RFC 6455 says, then go.
        if let error = error as? NIOWebSocketError {
            if error == .multiByteControlFrameLength || error == .fragmentedControlFrame {
                close(code: .protocolError, reason: nil)
            } else {
                tooLarge()
            }
        } else if let violation = error as? WireGate.ProtocolViolation {
            close(code: .protocolError, reason: violation.reason)
        } else {
            context.close(promise: nil)
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        // Held event frames go first, before the drain is told it may take more (it may not while any
        // are held).
        if context.channel.isWritable, holdsFrames { flushWire() }
        writable = context.channel.isWritable
        if writable { drainedSinceDeadline = true } else { unwritableSinceDeadline = true }
        writability.set(writable: writable && !holdsFrames)
        // A client whose socket does not take what we write is not read either: whatever it sends
        // waits in its own socket, and nothing it sends makes us write more meanwhile.
        updateReading(context)
        context.fireChannelWritabilityChanged()
    }

    /// Reads while the connection is writable, the client within its pace and its hub changes not
    /// backlogged.
    private func updateReading(_ context: ChannelHandlerContext) {
        try? context.channel.syncOptions?.setOption(ChannelOptions.autoRead, value: writable && !throttled && !backlogged)
    }

    /// Stops (or starts again) reading the client while the changes it asked of the hub wait their turn:
    /// what it sends meanwhile waits in its own socket, not as queued changes in the relay.
    func holdReading(_ hold: Bool) {
        guard hold != backlogged else { return }
        backlogged = hold
        if hold { heldSinceDeadline = true }
        if let context { updateReading(context) }
    }

    /// One frame's token; with none left, reading pauses until the next one is due (what was read
    /// already is still handled).
    private func takeToken(_ context: ChannelHandlerContext) {
        let now = NIODeadline.now()
        if let filledAt {
            let elapsed = Double((now - filledAt).nanoseconds) / 1e9
            tokens = min(Double(pace.burst), tokens + elapsed * Double(pace.perSecond))
        }
        filledAt = now
        tokens -= 1
        guard tokens < 1, !throttled else { return }
        throttled = true
        heldSinceDeadline = true
        updateReading(context)
        let wait = TimeAmount.nanoseconds(Int64((1 - tokens) / Double(pace.perSecond) * 1e9))
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        context.eventLoop.scheduleTask(in: wait) {
            let handler = loopBound.value
            handler.throttled = false
            if let context = handler.context { handler.updateReading(context) }
        }
    }

    /// A message in too many pieces closes with 1009 (its size is checked as each piece joins; a single
    /// frame's by the ``WireGate``).
    private func checkFragments() {
        guard fragmentCount > Self.maxFragments else { return }
        fragments = nil
        tooLarge()
    }

    private func tooLarge() {
        let limit = messageLimit.bytes
        let when = messageLimit.isOpen ? "" : " before authentication"
        let error = errorFrame(.messageTooLarge("message too large: at most \(limit) bytes\(when)"))
        write(error.payload, binary: error.binary)
        close(code: .messageTooLarge, reason: "message too large")
    }

    /// Answers a ping; with a pong already waiting to go out, only the newest ping is answered after it.
    private func pong(_ payload: ByteBuffer) {
        guard let context else { return }
        guard !pongInFlight else {
            pongWaiting = payload
            return
        }
        pongInFlight = true
        var data = payload
        data.reserveCapacity(data.readableBytes)
        let promise = context.eventLoop.makePromise(of: Void.self)
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        promise.futureResult.whenComplete { _ in
            let handler = loopBound.value
            handler.pongInFlight = false
            if let waiting = handler.pongWaiting {
                handler.pongWaiting = nil
                if !handler.isClosing { handler.pong(waiting) }
            }
        }
        context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .pong, data: data)), promise: promise)
        checkOutbound()
    }

    /// Bytes written to this client that its socket has not taken yet.
    var unsentBytes: Int {
        (try? context?.channel.syncOptions?.getOption(ChannelOptions.bufferedWritableBytes)) ?? 0
    }

    /// Closes a client that leaves more than the outbound limit unread: what it is told goes out only
    /// if it reads again; the close handshake's timeout ends it either way.
    func checkOutbound() {
        guard !isClosing, unsentBytes > outboundLimit else { return }
        let error = errorFrame(.tooMuchUnread("too much unread: more than \(outboundLimit) bytes written to this connection were not read"))
        write(error.payload, binary: error.binary, checked: false)
        close(code: .policyViolation, reason: "too much unread")
    }

    // MARK: writing (on the event loop)

    /// Writes one text frame; `flush` to send it now. A client then past the outbound limit is closed.
    func write(_ payload: ByteBuffer, binary: Bool = false, flush: Bool = true, checked: Bool = true) {
        guard let context, !isClosing else { return }
        context.write(wrapOutboundOut(WebSocketFrame(fin: true, opcode: binary ? .binary : .text, data: payload)), promise: nil)
        if flush { context.flush() }
        if checked { checkOutbound() }
    }

    /// Event frames taken from the hub that wait to be handed to the channel, each with the newest
    /// market sequence it completes (0: none) and the epoch a notice in it started. A frame waits only
    /// while others wait or the channel's unsent bytes would pass ``outboundLimit``, so event frames
    /// are bound by the same unread-bytes limit as everything else: a large replay waits here, as
    /// built frames, until the client reads, instead of piling up in the channel. What can wait here
    /// is bounded by what the hub lets a subscriber queue (its event buffer and one resume's replay).
    /// Made when a frame first has to wait (most connections never hold one: an idle connection pays
    /// nothing for it), then kept.
    private var heldFrames: CircularBuffer<(frame: ByteBuffer, through: WrittenThrough)>?
    /// What the frames written since the last ``flushWire()`` complete, noted at the flush.
    private var writtenThrough = WrittenThrough.nothing
    /// The channel's unsent bytes as of this turn's first frame, plus the frames written since: the
    /// channel's own count is read once a turn, since with TLS it does not see what was written until
    /// the flush (NIO's TLS handler keeps writes until then).
    private var turnUnsent: Int?
    /// NIO's default high-water mark of a channel's write buffer (past it the channel is not writable).
    static let writeBufferHighWaterMark = 64 << 10

    /// Hands a whole frame (header and payload, ``WireFrame``) to the channel below the frame encoder,
    /// in order with what ``write(_:flush:)`` writes, or holds it while it may not go yet; `through`
    /// is what the frame completes of a tagged session's position. Sent by ``flushWire()``. Without an
    /// outlet, nothing.
    func writeWire(_ frame: ByteBuffer, completing through: WrittenThrough = .nothing) {
        guard !isClosing, let outlet else { return }
        let unsent = turnUnsent ?? unsentBytes
        if !holdsFrames, mayWrite(frame.readableBytes, unsent: unsent) {
            send(frame, completing: through, to: outlet)
            turnUnsent = unsent + frame.readableBytes
        } else {
            heldFrames = heldFrames ?? CircularBuffer(initialCapacity: 2)
            heldFrames?.append((frame, through))
        }
    }

    /// Below NIO's high-water mark one more frame always goes (so a frame left held means the channel
    /// is not writable, and its becoming writable again sends the rest); above it, only what stays
    /// within the limit.
    private func mayWrite(_ count: Int, unsent: Int) -> Bool {
        unsent < Self.writeBufferHighWaterMark || unsent + count <= outboundLimit
    }

    private func send(_ frame: ByteBuffer, completing through: WrittenThrough, to outlet: WireGate) {
        // An empty one completes a position and sends nothing (``LoopDrain``).
        if frame.readableBytes > 0 { outlet.write(frame) }
        writtenThrough.follow(with: through)
    }

    /// Whether frames wait for the client to read (the connection's drain takes nothing more meanwhile).
    var holdsFrames: Bool { !(heldFrames?.isEmpty ?? true) }

    func flush() {
        context?.flush()
    }

    /// Sends the held frames that fit the unread-bytes limit, and flushes from the outlet (what lies
    /// between it and the socket only; the frame encoder has no part in a flush).
    func flushWire() {
        guard let outlet else {
            context?.flush()
            return
        }
        if holdsFrames {
            var unsent = turnUnsent ?? unsentBytes
            while let (frame, through) = heldFrames?.first, !isClosing, mayWrite(frame.readableBytes, unsent: unsent) {
                heldFrames?.removeFirst()
                unsent += frame.readableBytes
                send(frame, completing: through, to: outlet)
            }
        }
        turnUnsent = nil
        let written = writtenThrough
        writtenThrough = .nothing
        outlet.flush()
        // Noted after the flush: with TLS the socket's count sees a frame's bytes only when TLS writes
        // them, at the flush (without TLS the gate counted them as they were written). A flush that
        // makes the channel writable again may send and note later frames first (from
        // `channelWritabilityChanged`); a mark never goes back to an older sequence than the newest
        // noted, so the one noted here then only adds a byte count as late as theirs.
        if written != .nothing { wroteEvents(through: written) }
    }

    /// Events were just written: a tagged session notes how far the socket got and what its peer
    /// acknowledged.
    private func wroteEvents(through written: WrittenThrough) {
        guard let acknowledgedPosition, let socketCounter, let channel = context?.channel else { return }
        acknowledgedPosition.wrote(
            socketBytes: socketCounter.total, sequence: written.sequence, epoch: written.epoch, replayed: written.replayed,
            acknowledgedBytes: TCPInfoPrefix.bytesAcknowledged(by: channel))
        guard !isClosed, acknowledgedPosition.awaitsAcknowledgement else { return }
        // From the first delay again after a write (a check later than that, after a quiet spell, moves).
        acknowledgementDelay = Self.firstAcknowledgementCheck
        if let pending = acknowledgementCheck, pending.at <= .now() + acknowledgementDelay { return }
        acknowledgementCheck?.task.cancel()
        checkAcknowledgement()
    }

    /// The first re-read of what the client acknowledged after a write it had not yet (doubling while it
    /// still has not, up to ``lastAcknowledgementCheck``).
    static let firstAcknowledgementCheck = TimeAmount.milliseconds(200)
    static let lastAcknowledgementCheck = TimeAmount.seconds(5)
    /// A re-read of the acknowledged bytes is scheduled, for then.
    private var acknowledgementCheck: (task: Scheduled<Void>, at: NIODeadline)?
    /// The wait before the next re-read.
    private var acknowledgementDelay = firstAcknowledgementCheck

    /// A tagged session's client acknowledges a write after it was noted, and a quiet connection has no
    /// next write to read it at: without a re-read it would stand where it stood when its last writes
    /// went out (a break then replays them again; a replay held at its start stays held). So it is read
    /// again after ``acknowledgementDelay``, and again, less often, while a write waits for an
    /// acknowledgement that can count (``AcknowledgedPosition/awaitsAcknowledgement``) and the socket
    /// can say.
    private func checkAcknowledgement() {
        guard let context else { return }
        let delay = acknowledgementDelay
        acknowledgementDelay = min(delay * 2, Self.lastAcknowledgementCheck)
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        let task = context.eventLoop.scheduleTask(in: delay) {
            let handler = loopBound.value
            handler.acknowledgementCheck = nil
            guard let position = handler.acknowledgedPosition, let channel = handler.context?.channel, !handler.isClosed,
                let acknowledged = TCPInfoPrefix.bytesAcknowledged(by: channel)
            else { return }
            position.acknowledged(bytes: acknowledged)
            if position.awaitsAcknowledgement { handler.checkAcknowledgement() }
        }
        acknowledgementCheck = (task, .now() + delay)
    }

    /// Starts the close handshake with `code`: a close frame now, the channel closed when the client
    /// answers or after `answerWithin` (the close timeout unless given). At that time-out, what the
    /// client acknowledged is read once more, so a tagged session stands where it had by then.
    func close(code: WebSocketErrorCode, reason: String?, answerWithin: TimeAmount? = nil) {
        guard let context, !isClosing else { return }
        isClosing = true
        var data = context.channel.allocator.buffer(capacity: 2 + (reason?.utf8.count ?? 0))
        data.write(webSocketErrorCode: code)
        if let reason { data.writeString(String(reason.utf8.prefix(123)) ?? "") }
        context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .connectionClose, data: data)), promise: nil)
        closeAtTheLatest(in: answerWithin ?? closeTimeout, context: context)
    }

    /// Closes the channel in `delay` if it is still open then, reading once more what the client
    /// acknowledged, so a tagged session stands where it had by then.
    private func closeAtTheLatest(in delay: TimeAmount, context: ChannelHandlerContext) {
        let position = NIOLoopBound(acknowledgedPosition, eventLoop: context.eventLoop)
        context.eventLoop.scheduleTask(in: delay) { [channel = context.channel] in
            if channel.isActive, let position = position.value, let acknowledged = TCPInfoPrefix.bytesAcknowledged(by: channel) {
                position.acknowledged(bytes: acknowledged)
            }
            channel.close(promise: nil)
        }
    }

    /// Sends a frame of the connection's protocol, then closes with `code` (1008 unless told).
    func refuse(_ frame: ByteBuffer, binary: Bool, reason: String, code: WebSocketErrorCode = .policyViolation) {
        write(frame, binary: binary)
        close(code: code, reason: reason)
    }

    /// Told by its loop's ping deadlines once an interval after it opened (and after each ping).
    func pingOrDrop() {
        guard let context, !isClosing else { return }
        if awaitingPong {
            // Reading paused by the relay itself since the last deadline (its hub changes backlogged,
            // or its pace), or while the client's socket was full, unless full for the whole interval:
            // the answer may be waiting unread in the socket, so the peer is not judged gone. It is
            // judged a whole interval after reading went on (no second ping meanwhile: one unanswered
            // is enough to wait for). A peer that reads nothing fills its socket and stays full: it is
            // spared at most one interval.
            let pausedForASlowReader = unwritableSinceDeadline && (!unwritableAtDeadline || drainedSinceDeadline)
            if heldSinceDeadline || backlogged || throttled || pausedForASlowReader {
                startInterval()
                pings.add(self)
                return
            }
            // No answer for a whole interval: the peer is gone without a FIN.
            context.close(promise: nil)
            return
        }
        awaitingPong = true
        startInterval()
        context.writeAndFlush(wrapOutboundOut(WebSocketFrame(fin: true, opcode: .ping, data: ByteBuffer())), promise: nil)
        pings.add(self)
    }

    /// What the next deadline will know of this one's interval: what holds reading now.
    private func startInterval() {
        heldSinceDeadline = backlogged || throttled
        unwritableSinceDeadline = !writable
        unwritableAtDeadline = !writable
        drainedSinceDeadline = false
    }

    private func finish() {
        guard !isClosed else { return }
        isClosed = true
        acknowledgementCheck?.task.cancel()
        acknowledgementCheck = nil
        heldFrames = nil
        isClosing = true
        fragments = nil
        pongWaiting = nil
        writability.close()
        let conversation = self.conversation
        self.conversation = nil
        conversation?.closed()
    }
}
