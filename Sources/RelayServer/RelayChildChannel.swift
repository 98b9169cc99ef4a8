
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
/// timeout (``RequestHeadDeadline``), so a connection that sends a byte now and then holds nothing long.
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
        case refuse(HTTPResponse.Status, String)
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
        case refused(NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>, HTTPResponse.Status, String)
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
            let refusal = NIOLoopBoundBox<(HTTPResponse.Status, String)?>(nil, eventLoop: channel.eventLoop)
            let accepted = NIOLoopBoundBox<Accepted?>(nil, eventLoop: channel.eventLoop)
            let upgrader = NIOTypedWebSocketServerUpgrader<UpgradeResult>(
                maxFrameSize: routes.maxFrameSize,
                enableAutomaticErrorHandling: false,
                shouldUpgrade: { channel, head in
                    headDeadline.cancel()
                    switch routes.decide(head, channel) {
                    case .accept(let route):
                        accepted.value = route
                        return channel.eventLoop.makeSucceededFuture(HTTPHeaders())
                    case .refuse(let status, let message):
                        refusal.value = (status, message)
                        return channel.eventLoop.makeSucceededFuture(nil)
                    }
                },
                upgradePipelineHandler: { channel, _ in
                    channel.eventLoop.makeCompletedFuture {
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
                        try channel.pipeline.syncOperations.addHandler(HTTP1ToHTTPServerCodec(secure: false))
                        try channel.pipeline.syncOperations.addHandler(RequestHeadDeadline(timeout: routes.keepAliveTimeout))
                        try channel.pipeline.syncOperations.addHandler(HTTPConnectionStateHandler(logger: logger))
                        let asyncChannel = try NIOAsyncChannel<HTTPRequestPart, HTTPResponsePart>(
                            wrappingChannelSynchronously: channel, configuration: .init(isOutboundHalfClosureEnabled: true))
                        if let (status, message) = refusal.value { return UpgradeResult.refused(asyncChannel, status, message) }
                        return UpgradeResult.notUpgraded(asyncChannel)
                    }
                })
            var pipeline = NIOUpgradableHTTPServerPipelineConfiguration<UpgradeResult>(upgradeConfiguration: configuration)
            pipeline.enablePipelining = false
            pipeline.enableErrorHandling = false
            pipeline.enableResponseHeaderValidation = false
            let result = try channel.pipeline.syncOperations.configureUpgradableHTTPServerPipeline(configuration: pipeline)
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
            case .refused(let http, let status, let message):
                try await http.executeThenClose { _, outbound in
                    let body = ByteBuffer(string: #"{"error":"\#(JSONText.escape(message))","status":\#(status.code)}"#)
                    var fields: HTTPFields = [.connection: "close", .contentType: "application/json", .contentLength: "\(body.readableBytes)"]
                    if status == .unauthorized { fields[.wwwAuthenticate] = #"Bearer realm="relay""# }
                    try await outbound.write(contentsOf: [.head(HTTPResponse(status: status, headerFields: fields)), .body(body), .end(nil)])
                }
            }
        } catch let error as ChannelError where error == .inputClosed {
            logger.trace("connection closed before its first request")
        } catch {
            logger.debug("connection setup failed", metadata: ["error": "\(error)"])
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

/// Closes a kept-alive HTTP connection whose next request head does not come within `timeout` of the
/// end of the last response (waiting idle, or sending a head a byte at a time), and one whose request
/// body stops arriving for `timeout` (an upload that trickles). Between the HTTP codec and the request
/// handling; event-loop confined.
final class RequestHeadDeadline: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPRequestPart
    typealias InboundOut = HTTPRequestPart
    typealias OutboundIn = HTTPResponsePart
    typealias OutboundOut = HTTPResponsePart

    private let timeout: TimeAmount
    /// When the connection is closed unless a request part or an answer's end comes first (`nil`: the
    /// request is being handled, no deadline).
    private var due: NIODeadline?
    /// The one timer, at or before `due`: moving the deadline (twice a request) only writes `due`, and
    /// a timer that fires early sets itself again for the rest (rather than a timer made and cancelled
    /// per request part).
    private var timer: Scheduled<Void>?
    /// The response to the current request has ended (it may end before the request's body does).
    private var answered = false

    init(timeout: TimeAmount) {
        self.timeout = timeout
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head:
            answered = false
            restart(context)  // the body's first part within the timeout
        case .body:
            restart(context)  // and each next one
        case .end:
            // Handling takes what it takes; answered already, the next head is due within the timeout.
            if answered { restart(context) } else { due = nil }
        }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        if case .end = unwrapOutboundIn(data) {
            answered = true
            restart(context)  // the next head (or the rest of this body) within the timeout
        }
        context.write(data, promise: promise)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        due = nil
        timer?.cancel()
        timer = nil
    }

    private func restart(_ context: ChannelHandlerContext) {
        let due = NIODeadline.now() + timeout
        self.due = due
        if timer == nil { arm(context.channel, at: due) }
    }

    private func arm(_ channel: any Channel, at deadline: NIODeadline) {
        timer = channel.eventLoop.assumeIsolated().scheduleTask(deadline: deadline) { self.fired(channel) }
    }

    private func fired(_ channel: any Channel) {
        timer = nil
        guard let due else { return }
        if NIODeadline.now() >= due { channel.close(promise: nil) } else { arm(channel, at: due) }
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
