import MarketCore
import NIOCore
import RESTGateway
import Testing

/// `ByteBuffer.mentions`: whether a page's bytes hold a member's name, looked for before a body of
/// megabytes is read as text.
@Suite("REST gateway: a page is looked through for a member's name")
struct BodyMentionsTests {
    @Test func aNameIsFoundAnywhereAndOnlyWhole() {
        let needle = #""next_url""#
        #expect(ByteBuffer(string: #"{"next_url":"x"}"#).mentions(needle))
        #expect(ByteBuffer(string: #""next_url""#).mentions(needle), "the whole buffer")
        #expect(ByteBuffer(string: #"{"a":1,"next_url":null}"#).mentions(needle), "at the end")
        #expect(!ByteBuffer(string: #"{"next_ur":"x","next_urlx":1}"#).mentions(needle), "near misses")
        #expect(!ByteBuffer(string: #""next_ur"#).mentions(needle), "shorter than the name")
        #expect(!ByteBuffer().mentions(needle))
        // Many anchors before the match, one overlapping the match's own start.
        #expect(ByteBuffer(string: String(repeating: #"nnext"n"#, count: 100) + #"""next_url""#).mentions(needle))
        #expect(ByteBuffer(string: "abc").mentions(""), "nothing is in everything")
        #expect(ByteBuffer(string: #"a"""b"#).mentions(#"""""#), "a name of quotes only")
        #expect(!ByteBuffer(string: #"a""b"c"#).mentions(#"""""#), "three quotes apart are not three together")
    }

    @Test func onlyTheReadableBytesCount() {
        var buffer = ByteBuffer(string: #""next_url" and then {"a":1}"#)
        buffer.moveReaderIndex(forwardBy: 3)
        #expect(!buffer.mentions(#""next_url""#), "what was read is not looked at")
        var tail = ByteBuffer(string: #"{"a":1} "next_url""#)
        tail.moveWriterIndex(to: tail.writerIndex - 4)
        #expect(!tail.mentions(#""next_url""#), "nor what lies past the writer index")
    }

    @Test func aPageOfMegabytesIsLookedThroughWhole() {
        let rows = String(repeating: #"{"v":1000,"o":1.25,"c":1.5,"h":1.75,"l":1.0,"t":1577836800000,"n":10},"#, count: 50_000)
        #expect(!ByteBuffer(string: #"{"results":[\#(rows){}]}"#).mentions(#""next_url""#))
        #expect(ByteBuffer(string: #"{"results":[\#(rows){}],"next_url":"x"}"#).mentions(#""next_url""#))
    }

    @Test func everyOccurrenceIsReplacedInOneCopyAndABodyWithoutOneIsNotCopied() {
        let body = ByteBuffer(string: #"{"a":"KEY1","b":"xKEY1KEY1","c":"SECRET","d":"KEY"}"#)
        let scrubbed = body.replacing(["KEY1", "SECRET"], with: "<hidden>")
        #expect(String(buffer: scrubbed) == #"{"a":"<hidden>","b":"x<hidden><hidden>","c":"<hidden>","d":"KEY"}"#)
        var clean = ByteBuffer(string: #"{"a":1}"#)
        clean.moveReaderIndex(forwardBy: 1)
        let same = clean.replacing(["KEY1"], with: "<hidden>")
        #expect(same == clean)
        #expect(clean.withUnsafeReadableBytes { $0.baseAddress } == same.withUnsafeReadableBytes { $0.baseAddress }, "copied")
        #expect(String(buffer: ByteBuffer(string: "KEY1").replacing(["KEY1"], with: "")) == "")
    }

    /// One member is found (the object checked whole) without a dictionary of the others: a page of a
    /// million members costs its scan.
    @Test func oneMemberIsReadOutOfAnObjectOfMany() throws {
        let many = (0..<200_000).map { #""k\#($0)":\#($0)"# }.joined(separator: ",")
        let text = #"{\#(many),"next_url":"https://x/y?cursor=abc","z":[1,{"next_url":2}]}"#
        let found = try #require(JSONText.member("next_url", of: Substring(text)))
        #expect(found == #""https://x/y?cursor=abc""#)
        #expect(JSONText.member("absent", of: Substring(text)).map { $0 == nil } == true)
        #expect(JSONText.member("next_url", of: #"{"next_url":1"#) == nil, "not one whole object")
        #expect(JSONText.member("next_url", of: #"{"next_url":1} x"#) == nil, "text after it")
    }
}
