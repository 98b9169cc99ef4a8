import PolygonWire
import Testing

@testable import RelayServer

@Suite("Client keys: one name, one identity")
struct ClientKeyNamingTests {
    /// A plain key's automatic name never repeats a named key's: connection limits, topic budgets and
    /// tagged sessions are counted by name.
    @Test func plainKeysAreNamedAroundTheNamedOnes() throws {
        let named = try ClientKey(name: "key-1", secret: "restricted-secret", topics: ["Q.AAPL"])
        let authentication = try ClientAuthentication.resolve(keys: ["plain-a", "plain-b"], withRights: [named], listenHost: "127.0.0.1")
        guard case .keys(let keys) = authentication else {
            Issue.record("keys expected")
            return
        }
        let names = keys.map(\.name)
        #expect(Set(names).count == names.count, "\(names)")
        #expect(authentication.grant(for: "plain-a")?.name == "key-2" && authentication.grant(for: "plain-b")?.name == "key-3")
        #expect(authentication.grant(for: "restricted-secret")?.name == "key-1")
    }

    /// A configured key's grant shares its key's budgets (replays, tape reads); without keys (loopback)
    /// any key is everyone's, and shares none.
    @Test func onlyAConfiguredKeysConnectionsShareItsBudgets() throws {
        let keyed = try ClientAuthentication.resolve(keys: ["plain-a"], listenHost: "127.0.0.1")
        #expect(keyed.grant(for: "plain-a")?.isConfiguredKey == true)
        let open = try ClientAuthentication.resolve(keys: [], listenHost: "127.0.0.1")
        #expect(open.grant(for: "anything")?.isConfiguredKey == false)
    }
}
