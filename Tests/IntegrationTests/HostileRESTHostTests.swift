import Foundation
import Hummingbird
import Logging
import MarketREST
import NIOCore
import Portfolio
import PolygonRESTClient
import Testing

/// A REST host on loopback that answers each path with the body it was given (404 for any other): what
/// a broken or hostile vendor host sends, through the relay's real HTTP client.
struct ScriptedRESTHost {
    let answers: [String: String]

    /// Runs the host for `body`, which is given its base URL.
    func serve<T: Sendable>(_ body: (String) async throws -> T) async throws -> T {
        let router = Router()
        for (path, answer) in answers {
            router.get(RouterPath(path)) { _, _ in
                Response(status: .ok, headers: [.contentType: "application/json"], body: .init(byteBuffer: ByteBuffer(string: answer)))
            }
        }
        let (ports, listening) = AsyncStream.makeStream(of: Int.self)
        let app = Application(
            router: router, configuration: .init(address: .hostname("127.0.0.1", port: 0)),
            onServerRunning: { channel in listening.yield(channel.localAddress?.port ?? 0) }, logger: testLogger)
        return try await withServices([app]) {
            let port = try await within(.seconds(10), "the scripted REST host to listen") {
                for await port in ports { return port }
                throw TimeoutError(description: "the scripted REST host never listened")
            }
            return try await body("http://127.0.0.1:\(port)")
        }
    }
}

@Suite("A REST host's answers are bounded before they are kept")
struct HostileRESTHostTests {
    @Test func aLastTradeDatedInTheFutureIsTakenAsOfNowNotFreshForEver() async throws {
        let tomorrow = Int64(Date.now.addingTimeInterval(86_400).timeIntervalSince1970) * 1_000_000_000
        let host = ScriptedRESTHost(answers: [
            "/v2/last/trade/AAPL": #"{"status":"OK","results":{"p":12.5,"s":1,"t":\#(tomorrow)}}"#,
            "/v2/aggs/ticker/AAPL/prev": #"{"status":"OK","results":[{"c":12}]}"#,
        ])
        try await host.serve { base in
            let source = ReferencePrices(rest: PolygonREST(baseURL: base, apiKey: "k", attempts: 1, client: vendorTestClient))
            let trade = try #require(try await source.reference(for: "AAPL").get().lastTrade)
            #expect(trade.value == 12.5)
            #expect(trade.at <= .now, "a time in the future would keep the price fresh for ever")
        }
    }

    @Test func aNextURLIsAskedOfTheRelaysOwnRESTAddressWhateverHostItNames() async throws {
        let host = ScriptedRESTHost(answers: ["/v3/next": #"{"results":[]}"#, "/proxy/v3/next": #"{"results":[1]}"#])
        try await host.serve { base in
            let rest = PolygonREST(baseURL: base, apiKey: "k", attempts: 1, client: vendorTestClient)
            // The vendor's other name and port: followed, on the relay's address.
            let page = try await rest.get(nextURL: "https://api.massive.com:443/v3/next?cursor=YWJj&apiKey=leaked").get()
            #expect(String(buffer: page) == #"{"results":[]}"#)
            // Behind a proxy with a path: that path once.
            let proxied = PolygonREST(baseURL: base + "/proxy", apiKey: "k", attempts: 1, client: vendorTestClient)
            #expect(String(buffer: try await proxied.get(nextURL: "https://proxy.example/proxy/v3/next?cursor=YWJj").get()) == #"{"results":[1]}"#)
            // No path: nothing asked.
            guard case .failure(.malformed) = await rest.get(nextURL: "cursor=YWJj") else {
                Issue.record("a next_url without a path was followed")
                return
            }
        }
    }
}
