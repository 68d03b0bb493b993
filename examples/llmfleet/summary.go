package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/llmclient/llmtest"
)

// summary is what llmfleet prints at the end of a run.
type summary struct {
	procs, workers, jobs int
	redis                string // where the bucket is
	fake                 bool   // the API is llmtest's
	rpm, tpm             int
	reqBurst, tokBurst   float64 // the fleet's bucket's bursts (fleetLimits)

	ok, failed int
	errs       map[string]int
	answered   int64 // requests the API answered, retries included
	throttled  int64 // 429s among them
	tokens     int64 // usage the API counted (fake) or reported (real)
	ledger     float64
	makespan   time.Duration
	ideal      time.Duration
	// steady is the tokens admitted per second from the start of second
	// steadyFrom (after the burst and the start-up) to the end of second
	// steadyTo (the last whole one); 0 if unknown.
	steady               float64
	steadyFrom, steadyTo int

	chart chartData
}

// summarize computes the summary of a run that started at start.
func summarize(c config, res *results, api *llmtest.Server, start time.Time) summary {
	res.mu.Lock()
	defer res.mu.Unlock()
	reqLim, tokLim := fleetLimits(float64(c.rpm), float64(c.tpm), c.burst)
	s := summary{
		procs: c.procs, workers: c.workers, jobs: c.jobs,
		fake: api != nil, rpm: c.rpm, tpm: c.tpm, reqBurst: reqLim.Burst, tokBurst: tokLim.Burst,
		ok: res.ok, failed: res.failed, errs: res.errs,
		answered: res.attempts, throttled: res.throttled, tokens: res.tokens,
		ledger:   res.ledger,
		makespan: max(time.Unix(0, res.end).Sub(start), time.Millisecond),
	}
	reqRate, tokRate := float64(c.rpm)/60, float64(c.tpm)/60
	s.chart = chartData{
		procs: c.procs, workers: c.workers,
		requestLimit: reqRate, tokenLimit: tokRate,
		rpm: c.rpm, tpm: c.tpm,
		end: s.makespan.Seconds(),
	}
	if api != nil {
		st := api.Stats()
		s.answered, s.throttled, s.tokens = st.Accepted+st.Rejected, st.Rejected, st.TotalTokens
		// The hidden limits start full: the ideal admits their bursts at
		// once, and the rest at their rates.
		s.ideal = seconds(max(0,
			(float64(st.ChargedTokens)-float64(burstOf(c.tpm)))/tokRate,
			(float64(st.Accepted)-float64(burstOf(c.rpm)))/reqRate))
		s.chart.source = "as the fake API admitted them"
		s.chart.limitName = "hidden limit"
		s.chart.requestBurst, s.chart.tokenBurst = burstOf(c.rpm), burstOf(c.tpm)
		for _, p := range api.Series(time.Second) {
			x := p.Start.Sub(start).Seconds()
			if x < -0.5 { // before the start: nothing was sent yet
				continue
			}
			s.chart.bins = append(s.chart.bins, bin{
				t: x, requests: float64(p.Requests), tokens: float64(p.Tokens), rejected: float64(p.Rejected),
			})
		}
		if n := len(s.chart.bins); n >= 4 {
			s.steadyFrom, s.steadyTo = 2, n-1
			for _, b := range s.chart.bins[2 : n-1] {
				s.steady += b.tokens
			}
			s.steady /= float64(n - 3)
		}
	} else {
		s.ideal = seconds(max(float64(s.tokens)/tokRate, float64(res.ok)/reqRate))
		s.chart.source = "as the workers sent them"
		s.chart.limitName = "limit"
		s.chart.bins = clientBins(res.jobs, start)
	}
	s.chart.headline = fmt.Sprintf("%d calls in %.1f s, %d × 429", s.ok, s.makespan.Seconds(), s.throttled)
	return s
}

// clientBins returns the calls that succeeded and their tokens by the
// second (since start) in which they were sent, and the 429s by the second
// in which they came.
func clientBins(jobs []jobResult, start time.Time) []bin {
	var bins []bin
	at := func(ns int64) *bin {
		i := max(0, int(time.Unix(0, ns).Sub(start)/time.Second))
		for len(bins) <= i {
			bins = append(bins, bin{t: float64(len(bins))})
		}
		return &bins[i]
	}
	for _, j := range jobs {
		if j.Err == "" && j.Sent != 0 {
			b := at(j.Sent)
			b.requests++
			b.tokens += float64(j.Tokens)
		}
		for _, t := range j.Throttled {
			at(t).rejected++
		}
	}
	return bins
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// print writes s to w; chart is the chart's file, if one was drawn.
func (s *summary) print(w io.Writer, chart string) {
	secs := s.makespan.Seconds()
	reqRate, tokRate := float64(s.rpm)/60, float64(s.tpm)/60
	callsPerSec, tokPerSec := float64(s.ok)/secs, float64(s.tokens)/secs
	limit, api := "the fake API's hidden limit", "API"
	if !s.fake {
		limit, api = "as configured", "responses"
	}
	fmt.Fprintf(w, "llmfleet: %d chat calls by %d processes × %d goroutines sharing one bucket in %s\n",
		s.jobs, s.procs, s.workers, s.redis)
	fmt.Fprintf(w, "limit:    %s RPM, %s TPM (%s)\n", group(float64(s.rpm)), group(float64(s.tpm)), limit)
	fmt.Fprintf(w, "ok:       %d\n", s.ok)
	fmt.Fprintf(w, "failed:   %d\n", s.failed)
	keys := make([]string, 0, len(s.errs))
	for k := range s.errs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i == 3 {
			fmt.Fprintf(w, "          … and %d other errors\n", len(keys)-i)
			break
		}
		fmt.Fprintf(w, "          %d× %s\n", s.errs[k], k)
	}
	fmt.Fprintf(w, "429s:     %d of %d requests the API answered (%.2f%%)\n",
		s.throttled, s.answered, 100*ratio(float64(s.throttled), float64(s.answered)))
	fmt.Fprintf(w, "calls/s:  %.1f (limit %.1f: %.1f%%)\n", callsPerSec, reqRate, 100*callsPerSec/reqRate)
	fmt.Fprintf(w, "tokens/s: %s (limit %s: %.1f%%", group(tokPerSec), group(tokRate), 100*tokPerSec/tokRate)
	if s.steady > 0 {
		fmt.Fprintf(w, "; %.1f%% from %d s to %d s", 100*s.steady/tokRate, s.steadyFrom, s.steadyTo)
	}
	fmt.Fprintln(w, ")")
	if callsPerSec > reqRate || tokPerSec > tokRate {
		fmt.Fprintf(w, "          above 100%%: the bucket admits its burst (%s requests, %s tokens: -burst) at once,\n"+
			"          then its rate: burst + rate × T over a run of T, and the burst counts most in a short run\n",
			group(s.reqBurst), group(s.tokBurst))
	}
	if s.ideal > 0 {
		fmt.Fprintf(w, "makespan: %.2f s (ideal %.2f s: %+.1f%%)\n",
			secs, s.ideal.Seconds(), 100*(ratio(secs, s.ideal.Seconds())-1))
	} else {
		fmt.Fprintf(w, "makespan: %.2f s (ideal 0 s: the limit's burst holds the whole run)\n", secs)
	}
	fmt.Fprintf(w, "usage:    bucket %s tokens, %s %s (%+.2f%%)\n", group(s.ledger), api, group(float64(s.tokens)),
		100*(ratio(s.ledger, float64(s.tokens))-1))
	if chart != "" {
		fmt.Fprintf(w, "chart:    %s\n", chart)
	}
}

// ratio returns a/b, or 0 if b is 0.
func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// group formats v rounded to an integer, with commas between thousands:
// 600000 is "600,000".
func group(v float64) string {
	s := strconv.FormatFloat(math.Abs(math.Round(v)), 'f', 0, 64)
	var b strings.Builder
	if v <= -0.5 {
		b.WriteByte('-')
	}
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	return b.String()
}
