import MarketCore
import PolygonWire

/// What the relay takes from a stocks tape recorded from Polygon (the events these tests write).
let stocksCheck = EventCheck(market: .stocks, wire: PolygonWireProtocol(), maxBytes: 64 << 10)
