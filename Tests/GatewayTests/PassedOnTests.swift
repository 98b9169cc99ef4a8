import NIOCore
import Testing

@testable import RESTGateway

/// What of a vendor's answer the gateway passes on as it is, and what it keeps.
@Suite struct PassedOnTests {
    func fetched(_ type: String, _ body: String) -> RESTGateway.Fetched {
        RESTGateway.Fetched(status: 200, body: ByteBuffer(string: body), contentType: type, retryAfter: nil, fromRelay: false)
    }

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
        #expect(RESTGateway.looksWhole(fetched("application/json", #" {"results":[]} "#)))
        #expect(RESTGateway.looksWhole(fetched("application/json", #"[{"date":"2026-12-25"}]"#)))
        #expect(RESTGateway.looksWhole(fetched("image/png", "\u{89}PNG")))
        #expect(!RESTGateway.looksWhole(fetched("application/json", #"{"results":[1,2"#)), "cut short")
        #expect(!RESTGateway.looksWhole(fetched("text/html", "<html>{}</html>")))
        #expect(!RESTGateway.looksWhole(fetched("image/svg+xml", "<svg/>")))
    }
}
