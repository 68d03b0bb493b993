package tiktoken_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/llmclient"
	"github.com/sluicehq/sluice/tiktoken"
)

// BenchmarkSample estimates the whole sample, one request per op, beside
// chars/4; b.SetBytes makes MB/s the request bytes read.
func BenchmarkSample(b *testing.B) {
	samples := readSample(b)
	size := 0
	for _, s := range samples {
		size += len(s.body)
	}
	for _, m := range []struct {
		name string
		cost func(*http.Request) bucket.Cost
	}{
		{"tiktoken.RequestCost", tiktoken.RequestCost("")},
		{"llmclient.RequestCost(tiktoken.Estimate)", llmclient.RequestCost(tiktoken.Estimate)},
		{"chars-4", llmclient.RequestCost(nil)},
	} {
		b.Run(m.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(size / len(samples)))
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					r, _ := http.NewRequest("POST", "https://api.example.com/", bytes.NewReader(samples[i%len(samples)].body))
					m.cost(r)
					i++
				}
			})
		})
	}
}

// BenchmarkLarge estimates one request of 1 MiB of text: prose, and the
// tokenizer's worst case, a run of " \n".
func BenchmarkLarge(b *testing.B) {
	for name, text := range map[string]string{
		"prose":      strings.Repeat("The harbour town grew around a single stone pier. ", 1<<20/51),
		"whitespace": strings.Repeat(" \n", 1<<19),
	} {
		body, err := json.Marshal(llmclient.ChatRequest{Model: "gpt-4o", Messages: []llmclient.Message{{Role: "user", Content: text}}})
		if err != nil {
			b.Fatal(err)
		}
		cost := tiktoken.RequestCost("")
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				r, _ := http.NewRequest("POST", "https://api.example.com/", bytes.NewReader(body))
				cost(r)
			}
		})
	}
}
