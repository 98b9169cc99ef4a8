import Testing

@testable import Portfolio
@testable import PortfolioHTTP

@Suite("Numbers with exponents in request bodies")
struct JSONNumbersTests {
    func field(_ json: String) -> String? { JSONNumbers.fieldWithExponent(in: Array(json.utf8)) }

    @Test func anExponentIsFoundWithItsKey() {
        #expect(field(#"{"price":1e3}"#) == "price")
        #expect(field(#"{"a":"1e3","b":{"quantity":2.5E-1}}"#) == "quantity")
        #expect(field(#"[1, 2e2]"#) == "")
    }

    @Test func plainNumbersStringsAndLiteralsAreFine() {
        #expect(field(#"{"price":"1e3","note":"e","ok":true,"n":-12.50,"list":[1,false,null]}"#) == nil)
        #expect(field(#"{"escaped":"a\"1e3","value":3}"#) == nil)
        #expect(field("") == nil)
    }
}
