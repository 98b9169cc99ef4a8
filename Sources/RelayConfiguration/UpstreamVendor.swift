/// The vendors whose stream an upstream speaks, as the settings name them (`upstream.vendor`). Known
/// from the endpoint's host for Polygon's and Alpaca's own servers, given for any other (a test server,
/// a proxy). The composition root turns it into the market's protocol.
public enum UpstreamVendor: String, Sendable, CaseIterable {
    case polygon
    case alpaca

    /// The vendor of a vendor's own host (`socket.polygon.io`, `stream.data.alpaca.markets` …); `nil` for
    /// any other host.
    public static func of(host: String) -> UpstreamVendor? {
        let host = host.lowercased()
        if host.hasSuffix("alpaca.markets") { return .alpaca }
        if host.hasSuffix("polygon.io") || host.hasSuffix("massive.com") { return .polygon }
        return nil
    }
}
