// Package metrictest reads what an OpenTelemetry ManualReader collected,
// for sluice's tests of its metrics.
package metrictest

import (
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Point is one data point of a collection: a sum's or a gauge's value, or
// a histogram's count, with its histogram bounds.
type Point struct {
	Metric string
	Attrs  attribute.Set
	Value  float64
	Bounds []float64 // a histogram's; nil for others
	Sum    float64   // a histogram's sum of what it recorded; zero for others
}

// Collect returns every point r collects now; it fails the test on a kind
// of metric sluice does not record.
func Collect(t testing.TB, r *sdkmetric.ManualReader) []Point {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var out []Point
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				out = append(out, values(m.Name, d.DataPoints)...)
			case metricdata.Sum[float64]:
				out = append(out, values(m.Name, d.DataPoints)...)
			case metricdata.Gauge[int64]:
				out = append(out, values(m.Name, d.DataPoints)...)
			case metricdata.Gauge[float64]:
				out = append(out, values(m.Name, d.DataPoints)...)
			case metricdata.Histogram[float64]:
				out = append(out, counts(m.Name, d.DataPoints)...)
			case metricdata.Histogram[int64]:
				out = append(out, counts(m.Name, d.DataPoints)...)
			default:
				t.Fatalf("unexpected metric %s %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// values returns the points of a sum or a gauge named name.
func values[N int64 | float64](name string, dps []metricdata.DataPoint[N]) []Point {
	out := make([]Point, 0, len(dps))
	for _, p := range dps {
		out = append(out, Point{Metric: name, Attrs: p.Attributes, Value: float64(p.Value)})
	}
	return out
}

// counts returns the points of a histogram named name: each one's count,
// bounds and sum.
func counts[N int64 | float64](name string, dps []metricdata.HistogramDataPoint[N]) []Point {
	out := make([]Point, 0, len(dps))
	for _, p := range dps {
		out = append(out, Point{Metric: name, Attrs: p.Attributes, Value: float64(p.Count), Bounds: p.Bounds, Sum: float64(p.Sum)})
	}
	return out
}

// Points is Collect as a map: "name{k=v,...}" (attributes in order) to the
// point's value, or a histogram's count.
func Points(t testing.TB, r *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, p := range Collect(t, r) {
		out[p.Name()] = p.Value
	}
	return out
}

// Name is "metric{k=v,...}".
func (p Point) Name() string {
	var kv []string
	for _, a := range p.Attrs.ToSlice() {
		kv = append(kv, string(a.Key)+"="+a.Value.String())
	}
	return p.Metric + "{" + strings.Join(kv, ",") + "}"
}

// PromSeries counts the series a Prometheus scrape of r's metrics would
// hold: a histogram's are one per bucket bound, +Inf, _sum and _count.
func PromSeries(t testing.TB, r *sdkmetric.ManualReader) int {
	t.Helper()
	n := 0
	for _, p := range Collect(t, r) {
		if p.Bounds != nil {
			n += len(p.Bounds) + 3
		} else {
			n++
		}
	}
	return n
}
