// The vendor-neutral core (events, topics, markets, positions, limits, frames) was part of this
// module; until every module imports `MarketCore` itself, `import PolygonWire` brings it too.
@_exported import MarketCore
