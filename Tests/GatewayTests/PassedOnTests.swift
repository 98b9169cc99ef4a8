import NIOCore
import Testing

@testable import RESTGateway

/// What of a vendor's answer the gateway passes on as it is, and what it keeps.
@Suite struct PassedOnTests {
    func looksWhole(_ type: String, _ body: String) -> Bool { RESTGateway.looksWhole(ByteBuffer(string: body), as: type) }

    @Test func jsonAndRasterImagesArePassedOnAsSuchAndAnythingElseAsPlainText() {
        for json in ["application/json", "application/json; charset=utf-8", "application/problem+json"] {
            #expect(RESTGateway.passedOn(json) == "application/json; charset=utf-8", "\(json)")
        }
        #expect(RESTGateway.passedOn("image/png") == "image/png")
        #expect(RESTGateway.passedOn("IMAGE/JPEG; q=1") == "image/jpeg")
        // A list is taken by its last type in a browser: never passed on.
        let made = ["text/html", "text/html; x=json", "image/svg+xml", "application/javascript", "application/xml", "", "image/png, text/html", "text/json+html"]
        for type in made { #expect(RESTGateway.passedOn(type) == "text/plain; charset=utf-8", "\(type)") }
    }

    @Test func onlyWholeJSONObjectsOrArraysAndImagesAreKept() {
        #expect(looksWhole("application/json", #" {"results":[]} "#))
        #expect(looksWhole("application/json", #"[{"date":"2026-12-25"}]"#))
        #expect(looksWhole("image/png", "\u{89}PNG"))
        #expect(!looksWhole("application/json", #"{"results":[1,2"#), "cut short")
        #expect(!looksWhole("text/html", "<html>{}</html>"))
        #expect(!looksWhole("image/svg+xml", "<svg/>"))
    }
}

/// What a REST host answers with cannot make a metric series of its own.
@Suite struct UpstreamStatusLabelTests {
    @Test func documentedStatusesAreTheirOwnAndAnyOtherIsItsClass() {
        #expect(GatewayMetrics.statusLabel(200) == "200")
        #expect(GatewayMetrics.statusLabel(429) == "429")
        #expect(GatewayMetrics.statusLabel(418) == "4xx")
        #expect(GatewayMetrics.statusLabel(299) == "2xx")
        #expect(GatewayMetrics.statusLabel(599) == "5xx")
        #expect(GatewayMetrics.statusLabel(999) == "other")
        #expect(GatewayMetrics.statusLabel(0) == "other")
        let labels = Set((0...1_000).map(GatewayMetrics.statusLabel))
        #expect(labels.count == GatewayMetrics.namedStatuses.count + 6)
    }
}
