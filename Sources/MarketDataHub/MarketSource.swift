import MarketCore
import ServiceLifecycle

/// Where a market's events come from: a single relay's upstream connection (`UpstreamSource`), a
/// cluster node's feed (`ClusterSource`), and the next ones (a recorded tape, a replay). A source is a
/// plug-in with three ways in and out, and no others:
/// - **into the hub**: its ``SourceInbox``, pumped in order by ``HubPump`` (events, outages, losses,
///   refusals, epochs, recovered events of a gap fill: one door);
/// - **the wanted set**: the ``LocalInterest`` it is made with, which the hub keeps (the source batches
///   the changes as its upstream needs; a debounce is the source's business);
/// - **health**: its ``FeedStatus/report()``, for `/healthz`, `/metrics` and the dashboard.
///
/// It runs as a `Service` of the relay's service group, for as long as the relay runs.
public protocol MarketSource: Service, FeedStatus {}
