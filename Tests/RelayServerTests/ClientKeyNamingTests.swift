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

    /// A key that is none is refused, never left out (were it the only one, any key would get in on
    /// loopback), and so is a secret given twice (its client would get one of the two rights).
    @Test func aKeyThatIsNoneAndASecretGivenTwiceAreRefused() throws {
        for keys in [["sha256:abc"], ["good-key", "sha256:\(String(repeating: "z", count: 64))"]] {
            #expect(throws: ClientAuthentication.RefusedError.self, "\(keys)") { try ClientAuthentication.resolve(keys: keys, listenHost: "127.0.0.1") }
        }
        let reader = try ClientKey(name: "reader", secret: "shared-secret", topics: ["Q.AAPL"], portfolio: .none)
        let digest = ClientKey.digest(of: "shared-secret").map { String($0, radix: 16).count == 1 ? "0" + String($0, radix: 16) : String($0, radix: 16) }
        for plain in ["shared-secret", "sha256:" + digest.joined()] {
            let error = #expect(throws: ClientAuthentication.RefusedError.self, "\(plain)") {
                try ClientAuthentication.resolve(keys: [plain], withRights: [reader], listenHost: "127.0.0.1")
            }
            #expect(error?.description.contains("reader and key-1 are the same key") == true, "\(error?.description ?? "")")
            #expect(error?.description.contains("shared-secret") == false, "the secret is not shown")
        }
        let twice = try ClientKey(name: "writer", secret: "shared-secret")
        #expect(throws: ClientAuthentication.RefusedError.self) { try ClientAuthentication.resolve(keys: [], withRights: [reader, twice], listenHost: "127.0.0.1") }
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
