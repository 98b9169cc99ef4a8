
import HTTPTypes
import HummingbirdCore
import Logging
import NIOCore
import NIOHTTP1
import NIOHTTPTypes
import NIOHTTPTypesHTTP1
import NIOWebSocket
import MarketCore

/// How the relay's port sets up each accepted connection: HTTP/1.1 for Hummingbird's router, or a
/// WebSocket upgrade straight into the relay's own channel handlers (the market feed and the push
/// streams), with no task reading the connection and no Hummingbird WebSocket machinery in between.
///
/// Every accepted connection is counted by its address (``AddressGuard``): closed at once past the
/// descriptor budget or past its address's pending connections, pending until its first request head
/// (HTTP) or its authentication (market WebSocket), which must come within the head timeout; a
/// kept-alive HTTP connection is closed when its next request head does not come within the keep-alive
/// timeout, or it stops reading its answers for that long (``RequestHeadDeadline``), so a connection
/// that sends a byte now and then, or asks and never reads, holds nothing long.
///
/// `Sendable`, a value type; Hummingbird calls ``setup(channel:logger:)`` on the new channel's event
/// loop and ``handle(value:logger:)`` in a task that, for an upgraded connection, returns at once.
struct RelayChildChannel: ServerChildChannel, HTTPChannelHandler {
    /// Where a WebSocket upgrade leads, and how every connection is admitted and timed.
    struct Routes: Sendable {
        var addresses: AddressGuard
        var headTimeout: TimeAmount
        var keepAliveTimeout: TimeAmount
        var logger: Logger
        /// Decides, from the upgrade request, whether to accept it (its extra response headers) or why
        /// not; runs on the channel's loop.
        var decide: @Sendable (HTTPRequestHead, any Channel) -> Decision
        /// Adds the connection's handlers once the upgrade is done (frame codec already in place).
        var install: @Sendable (Accepted, any Channel, AddressGuard.Ticket?) throws -> Void
        var maxFrameSize: Int
    }

    enum Decision: Sendable {
        case accept(Accepted)
        case refuse(Refused)
    }

    /// An upgrade or first request answered with an error, then closed.
    struct Refused: Sendable {
        var status: HTTPResponse.Status
        var message: String
        /// When to ask again (`Retry-After`), if the client may soon.
        var retryAfter: String?
        /// A wrong key's, from this address: counted as its failure when it is answered, after the delay
        /// its failures call for (or answered as ``guessing`` at once).
        var wrongKeyOf: String?

        /// An address with as many delayed failure answers waiting as it may: refused unchecked.
        static let guessing = Refused(status: .tooManyRequests, message: ClientKeyMiddleware.guessing, retryAfter: "5")
    }

    /// An accepted upgrade: the market feed at an index of the server's markets, or the push stream at
    /// an index of the server's list (with the key that asked, when keys are required).
    enum Accepted: Sendable {
        /// A market, and the `Content-Type` of its upgrade (a codec its protocol lets a client choose).
        case market(Int, contentType: String?)
        case push(Int, ClientKey?)

        var isMarket: Bool {
            if case .market = self { true } else { false }
        }
    }

    enum UpgradeResult: Sendable {
        /// Our handlers run the connection from here.
        case upgraded
        case notUpgraded(NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>)
        case refused(NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>, Refused)
    }

    struct Value: ServerChildChannelValue {
        let upgradeResult: EventLoopFuture<UpgradeResult>
        let channel: any Channel
    }

    let responder: HTTPChannelHandler.Responder
    let routes: Routes

    init(responder: @escaping HTTPChannelHandler.Responder, routes: Routes) {
        self.routes = routes
        self.responder = Self.redirectingLateUpgrades(responder)
    }

    /// Each connection keeps up to `maxMessagesPerRead` receive buffers for reuse, sized by its receive
    /// allocator (NIO's default starts at 2 KiB). Downstream clients send little after their upgrade
    /// (an upgrade request of 150 to 600 bytes, then messages of tens of bytes), so one buffer starting
    /// at 256 bytes (growing with what arrives, up to 64 KiB) costs an idle client 256 bytes, not 8 KiB.
    static let receiveAllocator = AdaptiveRecvByteBufferAllocator(minimum: 64, initial: 256, maximum: 65536)

    func setup(channel: any Channel, logger: Logger) -> EventLoopFuture<Value> {
        channel.eventLoop.makeCompletedFuture {
            let routes = self.routes
            let address = channel.remoteAddress?.ipAddress ?? "unknown"
            let (ticket, refused) = routes.addresses.accept(address)
            guard let ticket else {
                routes.logger.debug("connection closed at accept", metadata: ["address": "\(address)", "why": "\(refused.map { "\($0)" } ?? "")"])
                try channel.pipeline.syncOperations.addHandler(CloseWhenActive())
                return Value(upgradeResult: channel.eventLoop.makeFailedFuture(ChannelError.inputClosed), channel: channel)
            }
            channel.closeFuture.whenComplete { _ in routes.addresses.closed(ticket) }
            // First, socket side: what TCP carries, for tagged sessions' acknowledged positions.
            try channel.pipeline.syncOperations.addHandler(SocketByteCounter(), position: .first)
            // The first request head (or upgrade) within the head timeout.
            let headDeadline = channel.eventLoop.scheduleTask(in: routes.headTimeout) { channel.close(promise: nil) }
            if let options = channel.syncOptions {
                try options.setOption(ChannelOptions.maxMessagesPerRead, value: 1)
                try options.setOption(ChannelOptions.recvAllocator, value: Self.receiveAllocator)
            }
            let refusal = NIOLoopBoundBox<Refused?>(nil, eventLoop: channel.eventLoop)
            let accepted = NIOLoopBoundBox<Accepted?>(nil, eventLoop: channel.eventLoop)
            let upgrader = NIOTypedWebSocketServerUpgrader<UpgradeResult>(
                maxFrameSize: routes.maxFrameSize,
                enableAutomaticErrorHandling: false,
                shouldUpgrade: { channel, head in
                    // The head deadline runs on until the upgrade is made (NIO makes it at the request's
                    // end): an upgrade that declares a body and never sends it is closed with the rest.
                    if Self.declaresBody(head) {
                        refusal.value = Refused(status: .badRequest, message: "a WebSocket upgrade request has no body")
                        return channel.eventLoop.makeSucceededFuture(nil)
                    }
                    switch routes.decide(head, channel) {
                    case .accept(let route):
                        accepted.value = route
                        return channel.eventLoop.makeSucceededFuture(HTTPHeaders())
                    case .refuse(let refused):
                        refusal.value = refused
                        return channel.eventLoop.makeSucceededFuture(nil)
                    }
                },
                upgradePipelineHandler: { channel, _ in
                    channel.eventLoop.makeCompletedFuture {
                        headDeadline.cancel()
                        guard let route = accepted.value else { throw ChannelError.inappropriateOperationForState }
                        try routes.install(route, channel, ticket)
                        return UpgradeResult.upgraded
                    }
                })
            let configuration = NIOTypedHTTPServerUpgradeConfiguration(
                upgraders: [upgrader],
                notUpgradingCompletionHandler: { channel in
                    channel.eventLoop.makeCompletedFuture {
                        // A request head came: no longer pending; the next ones within the keep-alive timeout.
                        headDeadline.cancel()
                        routes.addresses.settle(ticket)
                        // Plain HTTP: counted as such, or refused past the HTTP connections' share.
                        if refusal.value == nil, let refused = routes.addresses.serveHTTP(ticket) {
                            refusal.value = Refused(status: .serviceUnavailable, message: Self.httpRefusal(refused), retryAfter: "1")
                        }
                        try channel.pipeline.syncOperations.addHandler(HTTP1ToHTTPServerCodec(secure: false))
                        try channel.pipeline.syncOperations.addHandler(RequestHeadDeadline(timeout: routes.keepAliveTimeout))
                        try channel.pipeline.syncOperations.addHandler(HTTPConnectionStateHandler(logger: logger))
                        let asyncChannel = try NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>(
                            wrappingChannelSynchronously: channel, configuration: .init(isOutboundHalfClosureEnabled: true))
                        if let refused = refusal.value { return UpgradeResult.refused(asyncChannel, refused) }
                        return UpgradeResult.notUpgraded(asyncChannel)
                    }
                })
            var pipeline = NIOUpgradableHTTPServerPipelineConfiguration<UpgradeResult>(upgradeConfiguration: configuration)
            pipeline.enablePipelining = false
            pipeline.enableErrorHandling = false
            pipeline.enableResponseHeaderValidation = false
            let result = try channel.pipeline.syncOperations.configureUpgradableHTTPServerPipeline(configuration: pipeline)
            let upgrades = try channel.pipeline.syncOperations.handler(type: NIOTypedHTTPServerUpgradeHandler<UpgradeResult>.self)
            try channel.pipeline.syncOperations.addHandler(DecliningOtherUpgrades(), position: .before(upgrades))
            return Value(upgradeResult: result, channel: channel)
        }
    }

    func handle(value: Value, logger: Logger) async {
        do {
            switch try await value.upgradeResult.get() {
            case .upgraded:
                return
            case .notUpgraded(let http):
                // On the connection's own loop (see `LoopTaskExecutor`).
                await withTaskExecutorPreference(LoopTaskExecutor(loop: value.channel.eventLoop)) {
                    await handleHTTP(asyncChannel: http, logger: logger)
                }
            case .refused(let http, var refused):
                // A wrong key is counted here, where its answer is given (so every failure counted is
                // answered, and told answered), after its delay; or answered at once as guessing.
                var delay: Duration = .zero
                if let address = refused.wrongKeyOf {
                    if let counted = routes.addresses.failedUnlessGuessing(from: address) { delay = counted } else { refused = .guessing }
                }
                let answer = { [refused] in
                    try await http.executeThenClose { _, outbound in
                        let status = refused.status
                        let body = ClientKeyMiddleware.errorBody(status, refused.message)
                        var fields: HTTPFields = [.connection: "close", .contentType: "application/json", .contentLength: "\(body.readableBytes)"]
                        if status == .unauthorized { fields[.wwwAuthenticate] = #"Bearer realm="relay""# }
                        if let retryAfter = refused.retryAfter { fields[.retryAfter] = retryAfter }
                        try await outbound.write(contentsOf: [.head(HTTPResponse(status: status, headerFields: fields)), .body(body), .end(nil)])
                        // The relay's side ends; the client reads the answer, then the end, and closes (a
                        // request body it sent stays unread, so closing both sides now could reset the
                        // connection before the answer is read): closed in a moment if it does not.
                        outbound.finish()
                        let channel = value.channel
                        channel.eventLoop.scheduleTask(in: Self.refusalLinger) { channel.close(promise: nil) }
                        try? await channel.closeFuture.get()
                    }
                }
                if let address = refused.wrongKeyOf, delay > .zero {
                    try await routes.addresses.answer(after: delay, failureOf: address, answer)
                } else {
                    try await answer()
                }
            }
        } catch let error as ChannelError where error == .inputClosed {
            logger.trace("connection closed before its first request")
        } catch {
            // (An upgrade NIO could not make, e.g. one whose request went on past its head: nothing more
            // is read from it.)
            logger.debug("connection setup failed", metadata: ["error": "\(error)"])
            value.channel.close(promise: nil)
        }
    }

    /// Whether a request head says a body follows (a length other than 0, or a transfer coding).
    static func declaresBody(_ head: HTTPRequestHead) -> Bool {
        head.headers.contains(name: "transfer-encoding") || head.headers["content-length"].contains { $0.trimmingCharacters(in: .whitespaces) != "0" }
    }

    /// How long a refused connection waits for its client to close after the answer.
    static let refusalLinger: TimeAmount = .seconds(2)

    static func httpRefusal(_ refusal: AddressGuard.Refusal) -> String {
        switch refusal {
        case .total(let limit): "too many HTTP connections (\(limit) in all); try again in a moment"
        case .perAddress(let limit): "too many HTTP connections from this address (\(limit)); reuse one, or close some"
        }
    }

    /// NIO's upgrade handler only looks at a connection's first request. A WebSocket upgrade arriving
    /// later on a kept-alive connection is sent back to the same URI with the connection closed, so
    /// the client retries it first on a new connection (Hummingbird does the same).
    private static func redirectingLateUpgrades(_ responder: @escaping HTTPChannelHandler.Responder) -> HTTPChannelHandler.Responder {
        struct RedirectedUpgrade: Error {}
        return { request, writer, channel in
            guard request.headers[.upgrade]?.lowercased() == "websocket" else {
                return try await responder(request, writer, channel)
            }
            var location = request.uri.path
            if let query = request.uri.query { location += "?\(query)" }
            try await writer.writeResponse(HTTPResponse(status: .temporaryRedirect, headerFields: [.connection: "close", .location: location]))
            throw RedirectedUpgrade()
        }
    }
}

/// Closes an HTTP connection whose client holds it without doing its part, each within `timeout`:
/// - idle: the next request head does not come within `timeout` of the last answer taken by the socket;
/// - trickling: a request's next part (a head sent a byte at a time, an upload) does not come within
///   `timeout` of its last;
/// - not reading: what was written to it waits on the client, and its TCP stack acknowledges less than
///   ``minimumTaken`` bytes in `timeout` (pipelined requests piling up behind answers it does not read
///   included; a client that opens its window a probe at a time is not reading). A slow client that
///   reads goes on however long its answer takes. Where the socket cannot say, a write done counts.
///
/// A request being handled (its end read, its answer not ended, nothing waiting on the client) has no
/// deadline: handling takes what it takes, and the parts of a pipelined request behind it wait for
/// the relay to read them. Pipelined requests are read ahead of their answers, so requests and
/// answers are counted. A client whose TCP stack is still taking what it was sent (``minimumTaken``
/// a timeout) is not idle either: it may be reading the end of a large answer out of the socket's
/// buffers. Between the HTTP codec and the request handling; event-loop confined.
///
/// A request the codec may take as the end of HTTP on the connection (`CONNECT`, or one with an
/// `Upgrade` the relay did not make: a late WebSocket upgrade, `h2c`) is the connection's last: the
/// codec would keep every byte sent after it unparsed, so nothing is read past its end. Its answer
/// says `Connection: close`; once written, the relay's side is closed (its client reads the answer
/// whole, then the end), and the connection goes at the idle deadline or when the client closes. A
/// request whose answer says `Connection: close` of its own (a wrong key's `401`) ends it so too. So
/// does a connection whose request handling closed its side (`Connection: close`) with requests
/// still behind it: they are never answered.
final class RequestHeadDeadline: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let timeout: TimeAmount
    /// Requests whose end was read, and answers whose end was written.
    private var requestsRead = 0
    private var answersEnded = 0
    /// Writes handed to the connection that the socket has not taken yet.
    private var writesPending = 0
    /// A request's body being read (its head read, its end not yet): its bytes so far, and when it last
    /// made progress (its head, then each ``minimumTaken`` bytes): a body must come at that pace, or
    /// whole within a timeout, not a byte at a time just inside it.
    private var bodyBytes: UInt64?
    private var bodyProgressAt: UInt64 = 0
    private var lastBodyProgress = NIODeadline.now()
    /// When the client last sent a request part, and last took what it was sent (at least
    /// ``minimumTaken`` bytes, or everything; or was sent something after nothing was waiting).
    private var lastRead = NIODeadline.now()
    private var lastTaken = NIODeadline.now()
    /// Its TCP stack's acknowledged bytes at `lastTaken` (`nil`: the socket cannot say).
    private var acknowledged: UInt64?
    /// What a client must take per timeout to count as reading.
    static let minimumTaken: UInt64 = 64 << 10
    private static let declined = HTTPField.Name(DecliningOtherUpgrades.declined)
    /// The one timer, at or before the deadline: a deadline that moves later only changes what
    /// ``due`` says, and a timer that fires early sets itself again for the rest.
    private var timer: (task: Scheduled<Void>, at: NIODeadline)?
    private var removed = false
    /// The request that ends HTTP on the connection (its number, from 1), once its head was read: no
    /// reads past its end, the relay's side closed after its answer.
    private var lastRequest: Int?
    /// The relay's side of the connection is closed: nothing more will be answered.
    private var outputClosed = false

    init(timeout: TimeAmount) {
        self.timeout = timeout
    }

    /// When the connection is closed unless its client does its part first (`nil`: none).
    private var due: NIODeadline? {
        if writesPending > 0 { return lastTaken + timeout }
        // Handling (a pipelined request's parts behind it wait for the relay to read them).
        if requestsRead > answersEnded, !outputClosed { return nil }
        // Sending a request's body: at least ``minimumTaken`` bytes (or its end) a timeout.
        if bodyBytes != nil { return max(lastBodyProgress, lastTaken) + timeout }
        // Idle, or sending a request's head: the next within the timeout.
        return max(lastRead, lastTaken) + timeout
    }

    func handlerAdded(context: ChannelHandlerContext) {
        update(context.channel)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        lastRead = .now()
        switch unwrapInboundIn(data) {
        case .head(let head):
            // CONNECT, or any `Upgrade` (on the first request, one declined: ``DecliningOtherUpgrades``):
            // a superset of when the codec stops parsing (`Connection` or `Proxy-Connection` asking for
            // it), at the cost of a keep-alive for the rest.
            let upgrade = head.headerFields[.upgrade] != nil || Self.declined.map { head.headerFields[$0] != nil } == true
            if lastRequest == nil, head.method == .connect || upgrade { lastRequest = requestsRead + 1 }
            (bodyBytes, bodyProgressAt, lastBodyProgress) = (0, 0, .now())
        case .body(let part):
            let read = (bodyBytes ?? 0) + UInt64(part.readableBytes)
            bodyBytes = read
            if read - bodyProgressAt >= Self.minimumTaken { (bodyProgressAt, lastBodyProgress) = (read, .now()) }
        case .end:
            requestsRead += 1
            bodyBytes = nil
        }
        update(context.channel)
        context.fireChannelRead(data)
    }

    func read(context: ChannelHandlerContext) {
        if let lastRequest, requestsRead >= lastRequest { return }
        context.read()
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        var ends = false
        var data = data
        switch unwrapOutboundIn(data) {
        case .head(var head):
            if let lastRequest, answersEnded + 1 >= lastRequest {
                head.headerFields[.connection] = "close"
                data = wrapOutboundOut(.head(head))
            } else if head.headerFields[.connection]?.lowercased() == "close" {
                // An answer that ends the connection (a wrong key's): its request is the last read.
                lastRequest = answersEnded + 1
            }
        case .body:
            break
        case .end:
            answersEnded += 1
            ends = lastRequest.map { answersEnded >= $0 } ?? false
        }
        if writesPending == 0 { taken(context.channel) }
        writesPending += 1
        // Our own promise (on this loop, whatever loop a caller's is on), passed on to the caller's.
        let written = context.eventLoop.makePromise(of: Void.self)
        if let promise { written.futureResult.cascade(to: promise) }
        let channel = context.channel
        written.futureResult.assumeIsolated().whenComplete { result in
            self.writesPending -= 1
            // All taken; or, where the socket cannot say how much, one write.
            if self.writesPending == 0 || self.acknowledged == nil { self.taken(channel) }
            self.update(channel)
            // The relay's side ends after the answer (the client reads it whole, then the end).
            if ends, case .success = result { channel.close(mode: .output, promise: nil) }
        }
        update(context.channel)
        context.write(data, promise: written)
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        if mode == .output {
            // Nothing more will be answered: the idle deadline runs, whatever was asked behind.
            outputClosed = true
            update(context.channel)
        }
        context.close(mode: mode, promise: promise)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        removed = true
        timer?.task.cancel()
        timer = nil
    }

    /// The client took what it was sent, or enough of it (or is sent something after nothing waited).
    private func taken(_ channel: any Channel) {
        lastTaken = .now()
        acknowledged = TCPInfoPrefix.bytesAcknowledged(by: channel)
    }

    /// Arms the timer for the deadline when none is set at or before it.
    private func update(_ channel: any Channel) {
        guard !removed, let due else { return }
        if let timer {
            guard timer.at > due else { return }
            timer.task.cancel()
        }
        arm(channel, at: due)
    }

    private func arm(_ channel: any Channel, at deadline: NIODeadline) {
        timer = (channel.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) { self.fired(channel) }, deadline)
    }

    private func fired(_ channel: any Channel) {
        timer = nil
        guard var due else { return }
        if NIODeadline.now() >= due, let before = acknowledged,
            let now = TCPInfoPrefix.bytesAcknowledged(by: channel), now >= before &+ Self.minimumTaken
        {
            // Its TCP stack took enough more since: a slow reader (of answers still waiting, or of the
            // last one's end out of the socket's buffers).
            taken(channel)
            due = lastTaken + timeout
        }
        if NIODeadline.now() >= due { channel.close(promise: nil) } else { arm(channel, at: due) }
    }
}

/// The first request of a connection asking for an `Upgrade` other than a well-formed WebSocket one
/// (`h2c`: curl `--http2`, Java's `HttpClient` over `http://`; a WebSocket request without one
/// `Sec-WebSocket-Key` or with a version other than 13) is answered as plain HTTP/1.1. NIO's upgrade
/// handler would lose such a request (it keeps none of it while it looks for an upgrader, and finds
/// none): its client got an empty reply. Its `Upgrade` header is renamed ``declined`` on its way there, so
/// the upgrade handler takes it as an ordinary request, and ``RequestHeadDeadline`` still knows it is
/// the connection's last (the codec stops parsing after it). Between the codec and the upgrade
/// handler, for the first request only.
final class DecliningOtherUpgrades: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart

    /// The header an `Upgrade` the relay declined is renamed to.
    static let declined = "X-Relay-Declined-Upgrade"

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .head(var head) = unwrapInboundIn(data) else {
            context.fireChannelRead(data)
            return
        }
        let asked = head.headers[canonicalForm: "upgrade"]
        // What NIO's WebSocket upgrader checks before it takes a request.
        let webSocket =
            asked.contains { $0.lowercased() == "websocket" } && head.headers["sec-websocket-key"].count == 1
            && head.headers["sec-websocket-version"] == ["13"]
        if !asked.isEmpty, !webSocket {
            let names = asked.joined(separator: ", ")
            head.headers.remove(name: "upgrade")
            head.headers.add(name: Self.declined, value: names)
            context.fireChannelRead(wrapInboundOut(.head(head)))
        } else {
            context.fireChannelRead(data)
        }
        context.pipeline.syncOperations.removeHandler(self, promise: nil)
    }
}

/// Closes its channel as soon as it is active (a connection refused at accept).
final class CloseWhenActive: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer

    func handlerAdded(context: ChannelHandlerContext) {
        if context.channel.isActive { context.close(promise: nil) }
    }

    func channelActive(context: ChannelHandlerContext) {
        context.close(promise: nil)
    }
}
