package llmclient

// ResetNoUsageWarning lets the next stream without usage be logged.
func ResetNoUsageWarning() { warnedNoUsage.last.Store(0) }

// ResetUnknownModelWarning lets the next call keyed under UnknownModel be
// logged.
func ResetUnknownModelWarning() { unknownModelWarned.last.Store(0) }
