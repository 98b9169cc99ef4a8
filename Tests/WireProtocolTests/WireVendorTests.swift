import AlpacaWire
import MarketCore
import PolygonWire
import Testing

/// The vendor list as the settings read it: names, hosts, paths, and the protocol each gives a market.
@Suite("Vendors: how an upstream's URL names its protocol")
struct WireVendorTests {
    let vendors: [WireVendor] = [.polygon, .alpaca]

    @Test func aVendorIsNamedInAnyCaseAndAnUnknownNameIsNone() {
        #expect(vendors.named("ALPACA") == .alpaca)
        #expect(vendors.named("polygon") == .polygon)
        #expect(vendors.named("databento") == nil)
    }

    @Test func theHostNamesTheVendorThenThePathThenTheFirstListed() {
        #expect(vendors.speaking(host: "stream.data.alpaca.markets", path: "/stocks") == .alpaca, "the host first")
        #expect(vendors.speaking(host: "SOCKET.MASSIVE.COM", path: "/v2/iex") == .polygon, "a vendor's own host wins over a path")
        #expect(vendors.speaking(host: "127.0.0.1", path: "/v1beta3/crypto/us") == .alpaca, "Alpaca's feed path on any host")
        #expect(vendors.speaking(host: "127.0.0.1", path: "/stocks") == .polygon, "else the first listed")
        #expect([WireVendor]().speaking(host: "127.0.0.1", path: "/stocks") == nil)
    }

    @Test func aVendorsPathNamesTheMarketAndTheFeedOfItsProtocol() throws {
        #expect(vendors.market(ofPath: "/v1beta1/opra") == .options)
        #expect(vendors.market(ofPath: "/stocks") == nil, "a plain segment is read by the settings themselves")
        let sip = WireVendor.alpaca.wireProtocol(market: .stocks, path: "/v2/sip")
        #expect(sip.servedPaths(of: .stocks).contains("/v2/sip"))
        let usual = WireVendor.alpaca.wireProtocol(market: .crypto)
        #expect(usual.servedPaths(of: .crypto).contains("/v1beta3/crypto/us"), "no path: the market's usual feed")
        #expect(WireVendor.polygon.wireProtocol(market: .forex).servedPaths(of: .forex) == ["/forex"])
        #expect(WireVendor.alpaca.signsInWithSecret && !WireVendor.polygon.signsInWithSecret)
    }
}
