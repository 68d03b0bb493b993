package llmtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// geminiStatus is the body of Gemini's error: a google.rpc.Status in its
// JSON form.
type geminiStatus struct {
	Error struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Status  string          `json:"status"`
		Details []geminiDetails `json:"details,omitempty"`
	} `json:"error"`
}

// geminiDetails is one entry of a google.rpc.Status's details: a
// QuotaFailure (Violations) or a RetryInfo (RetryDelay).
type geminiDetails struct {
	Type       string            `json:"@type"`
	Violations []geminiViolation `json:"violations,omitempty"`
	RetryDelay string            `json:"retryDelay,omitempty"`
}

// geminiViolation is one violation of a google.rpc.QuotaFailure, with the
// fields the Gemini API adds.
type geminiViolation struct {
	QuotaMetric     string            `json:"quotaMetric"`
	QuotaID         string            `json:"quotaId"`
	QuotaDimensions map[string]string `json:"quotaDimensions"`
	QuotaValue      string            `json:"quotaValue"`
}

// The type URLs of the details of a Gemini error.
const (
	geminiQuotaFailure = "type.googleapis.com/google.rpc.QuotaFailure"
	geminiRetryInfo    = "type.googleapis.com/google.rpc.RetryInfo"
)

// geminiQuota returns the quotaMetric and quotaId by which the Gemini API
// names a limit of dimension d whose window is w: per day for a window of a
// day or more, else per minute (Gemini has no other; a test's limit per
// second stands for one per minute).
func geminiQuota(d Dimension, w time.Duration) (metric, id string) {
	per := "Minute"
	if w >= 24*time.Hour {
		per = "Day"
	}
	switch d {
	case Tokens, InputTokens:
		return "generativelanguage.googleapis.com/generate_content_paid_tier_input_token_count",
			"GenerateContentInputTokensPerModelPer" + per
	case OutputTokens: // Gemini limits no output tokens; named in its fashion
		return "generativelanguage.googleapis.com/generate_content_paid_tier_output_token_count",
			"GenerateContentOutputTokensPerModelPer" + per
	}
	return "generativelanguage.googleapis.com/generate_content_paid_tier_requests",
		"GenerateRequestsPer" + per + "PerProjectPerModel"
}

// writeGemini answers d, a refusal by the limits of a request for model
// (empty for a plain call), as the Gemini API does (see Config.Gemini).
func writeGemini(w http.ResponseWriter, d *decision, model string) {
	var e geminiStatus
	e.Error.Code, e.Error.Status = http.StatusTooManyRequests, "RESOURCE_EXHAUSTED"
	var msg strings.Builder
	msg.WriteString("You exceeded your current quota, please check your plan and billing details.")
	qf := geminiDetails{Type: geminiQuotaFailure}
	for i, q := range d.quotas {
		if q == nil || !d.refusing[i] {
			continue
		}
		metric, id := geminiQuota(Dimension(i), q.limit.window())
		dims := map[string]string{"location": "global"}
		if model != "" {
			dims["model"] = model
		}
		limit := strconv.FormatInt(q.limit.capacity(), 10)
		qf.Violations = append(qf.Violations, geminiViolation{metric, id, dims, limit})
		fmt.Fprintf(&msg, "\n* Quota exceeded for metric: %s, limit: %s", metric, limit)
		if model != "" {
			msg.WriteString(", model: " + model)
		}
	}
	e.Error.Details = []geminiDetails{qf}
	if d.wait > 0 {
		fmt.Fprintf(&msg, "\nPlease retry in %v.", d.wait)
		e.Error.Details = append(e.Error.Details, geminiDetails{Type: geminiRetryInfo, RetryDelay: geminiDelay(d.wait)})
	}
	e.Error.Message = msg.String()
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(http.StatusTooManyRequests)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ") // as Gemini writes it
	enc.Encode(e)
}

// geminiDelay writes wait as the Gemini API writes a RetryInfo's
// retryDelay: a google.protobuf.Duration in its JSON form, truncated to
// whole seconds ("59s" for a wait of 59.322187034 s, "0s" below a second).
func geminiDelay(wait time.Duration) string {
	return strconv.FormatInt(int64(wait/time.Second), 10) + "s"
}
