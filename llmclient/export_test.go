package llmclient

// ResetNoUsageWarning lets the next stream without usage be logged.
func ResetNoUsageWarning() { warnedNoUsage.Store(0) }
