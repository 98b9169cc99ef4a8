/// What orders a type's events against each other, so gap fill can tell which recovered events the
/// relay already had live (``WireProtocol/recoveryOrder(of:)``, read by
/// ``WireProtocol/orderValue(_:of:)``): a sequence number rising per ticker, a bar's start, or the
/// event's time where there is neither. The raw values are the codes the cluster's fill messages carry.
public enum RecoveryOrder: String, Sendable {
    case sequence = "q"
    case barStart = "s"
    case time = "t"
}
