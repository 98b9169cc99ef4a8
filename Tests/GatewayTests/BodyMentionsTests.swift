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
}
