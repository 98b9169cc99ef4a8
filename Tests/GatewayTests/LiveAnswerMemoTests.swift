import MarketCore
import NIOCore
import RESTGateway
import Testing

/// A live route's answer is rendered once per held event, not once per request.
@Suite("REST gateway: live answers rendered once per held event")
struct LiveAnswerMemoTests {
    func event(_ json: String) -> MarketEvent {
        MarketEvent(eventType: "T", ticker: "AAPL", bytes: ByteBuffer(string: json), receivedAt: 0)
    }

    @Test func theSameHeldEventIsRenderedOnceAndANewOneAgain() {
        let memo = LiveAnswerMemo<String>()
        let topic = Topic(checkedEventType: "T", ticker: "AAPL")
        var renders = 0
        func ask(_ held: MarketEvent, route: String = "last-trade", market: Market = .stocks) -> String? {
            memo.answer(route, market: market, topic: topic, event: held) {
                renders += 1
                return "answer \(renders) to \(String(buffer: held.bytes))"
            }
        }
        let first = event(#"{"ev":"T","sym":"AAPL","p":1}"#)
        #expect(ask(first) == #"answer 1 to {"ev":"T","sym":"AAPL","p":1}"#)
        // Asked again with the same event (another copy of the same bytes): not rendered again.
        #expect(ask(event(#"{"ev":"T","sym":"AAPL","p":1}"#)) == #"answer 1 to {"ev":"T","sym":"AAPL","p":1}"#)
        #expect(renders == 1)
        // A new held event is rendered, and kept in its place.
        let second = event(#"{"ev":"T","sym":"AAPL","p":2}"#)
        #expect(ask(second) == #"answer 2 to {"ev":"T","sym":"AAPL","p":2}"#)
        #expect(ask(second) == #"answer 2 to {"ev":"T","sym":"AAPL","p":2}"#)
        #expect(renders == 2)
        // Another route, or the same topic in another market, has its own answer.
        #expect(ask(second, route: "snapshot") == #"answer 3 to {"ev":"T","sym":"AAPL","p":2}"#)
        #expect(ask(second, market: .options) == #"answer 4 to {"ev":"T","sym":"AAPL","p":2}"#)
        #expect(memo.count == 3)
    }

    @Test func anEventThatDoesNotRenderIsNotKeptAndTheMemoIsBounded() {
        let memo = LiveAnswerMemo<Int>(capacity: 4)
        let held = event("{}")
        #expect(memo.answer("r", market: .stocks, topic: Topic(checkedEventType: "T", ticker: "A"), event: held) { nil } == nil)
        #expect(memo.count == 0)
        for index in 0..<10 {
            _ = memo.answer("r", market: .stocks, topic: Topic(checkedEventType: "T", ticker: "T\(index)"), event: held) { index }
            #expect(memo.count <= 4, "the memo holds \(memo.count) answers past its capacity of 4")
        }
        // The newest is kept.
        #expect(memo.answer("r", market: .stocks, topic: Topic(checkedEventType: "T", ticker: "T9"), event: held) { -1 } == 9)
    }
}
