import NIOCore
import Testing

@testable import RESTGateway

/// What of a vendor's answer the gateway passes on as it is, and what it keeps.
@Suite struct PassedOnTests {
    func fetched(_ type: String, _ body: String) -> RESTGateway.Fetched {
        RESTGateway.Fetched(status: 200, body: ByteBuffer(string: body), contentType: type, retryAfter: nil, fromRelay: false)
    }

    @Test func jsonAndRasterImagesKeepTheirTypeAndAnythingElseIsPlainText() {
        for kept in ["application/json", "application/json; charset=utf-8", "application/problem+json", "image/png", "IMAGE/JPEG"] {
            #expect(RESTGateway.passedOn(kept) == kept, "\(kept)")
        }
        for made in ["text/html", "text/html; x=json", "image/svg+xml", "application/javascript", "application/xml", ""] {
            #expect(RESTGateway.passedOn(made) == "text/plain; charset=utf-8", "\(made)")
        }
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
