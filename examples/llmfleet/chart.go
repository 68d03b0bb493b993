package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// chartData is what the chart shows.
type chartData struct {
	procs, workers int
	// bins are the seconds of the run, from its start: what was admitted
	// in each, as source says.
	bins   []bin
	source string
	end    float64 // seconds from the start to the last answer
	// The limit's rates, per second, and as configured, per minute;
	// limitName names it in the legend.
	requestLimit, tokenLimit float64
	rpm, tpm                 int
	limitName                string
	// The limit's bursts; zero if unknown.
	requestBurst, tokenBurst int64
	// headline sums the run up, in the title.
	headline string
}

// bin is one second of the run.
type bin struct {
	t                          float64 // its start, in seconds since the run's
	requests, tokens, rejected float64
}

// Colours of the chart.
var (
	admittedColor = color.NRGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	fillColor     = color.NRGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0x40}
	limitColor    = color.NRGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
	rejectedColor = color.NRGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	rejectedFill  = color.NRGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0x99}
)

// writeChart draws d into file, a .png or .svg: the tokens admitted per
// second above, the requests and the 429s per second below, each against
// its limit.
func writeChart(file string, d chartData) error {
	rejected := 0.0
	for _, b := range d.bins {
		rejected += b.rejected
	}
	top, err := panel(d, fmt.Sprintf("llmfleet: %d processes × %d goroutines sharing one sluice bucket: %s\n"+
		"tokens admitted per second, %s", d.procs, d.workers, d.headline, d.source),
		"tokens / s", func(b bin) float64 { return b.tokens }, d.tokenLimit,
		fmt.Sprintf("%s: %s TPM = %s tokens/s%s", d.limitName, group(float64(d.tpm)), group(d.tokenLimit),
			burstNote(d.tokenBurst)), nil)
	if err != nil {
		return err
	}
	bottom, err := panel(d, "requests admitted per second, and 429 responses",
		"requests / s", func(b bin) float64 { return b.requests }, d.requestLimit,
		fmt.Sprintf("%s: %s RPM = %s requests/s%s", d.limitName, group(float64(d.rpm)), formatRate(d.requestLimit),
			burstNote(d.requestBurst)),
		func(p *plot.Plot) error {
			l, err := stepLine(d.bins, func(b bin) float64 { return b.rejected }, d.end)
			if err != nil {
				return err
			}
			l.Color, l.FillColor = rejectedColor, rejectedFill
			p.Add(l)
			p.Legend.Add(fmt.Sprintf("429 responses (%.0f in all)", rejected), l)
			return nil
		})
	if err != nil {
		return err
	}
	bottom.X.Label.Text = "seconds since the fleet started"

	const w, h = 10.5 * vg.Inch, 7.5 * vg.Inch
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(file)), ".")
	c, err := draw.NewFormattedCanvas(w, h, format)
	if err != nil {
		return err
	}
	dc := draw.New(c)
	white := dc
	white.SetColor(color.White)
	white.Fill(dc.Rectangle.Path())
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	plots := [][]*plot.Plot{{top}, {bottom}}
	canvases := plot.Align(plots, tiles, dc)
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])

	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// panel returns a plot of value per second against the limit, titled
// title; extra, if not nil, adds to it before the limit line is drawn.
func panel(d chartData, title, ylabel string, value func(bin) float64, limit float64, limitLabel string,
	extra func(*plot.Plot) error) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(13)
	p.Y.Label.Text = ylabel
	p.X.Label.Text = " "
	p.X.Tick.Marker, p.Y.Tick.Marker = roundTicks{}, roundTicks{}
	p.Add(plotter.NewGrid())

	admitted, err := stepLine(d.bins, value, d.end)
	if err != nil {
		return nil, err
	}
	admitted.Color, admitted.FillColor, admitted.Width = admittedColor, fillColor, vg.Points(1.5)
	p.Add(admitted)
	p.Legend.Add("admitted", admitted)
	if extra != nil {
		if err := extra(p); err != nil {
			return nil, err
		}
	}
	lim := plotter.NewFunction(func(float64) float64 { return limit })
	lim.Color, lim.Width = limitColor, vg.Points(2)
	lim.Dashes = []vg.Length{vg.Points(6), vg.Points(4)}
	p.Add(lim)
	p.Legend.Add(limitLabel, lim)
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(11)
	p.Legend.Padding = vg.Points(2)
	p.Legend.ThumbnailWidth = vg.Points(24)
	p.Legend.XOffs = -2 * vg.Millimeter
	p.Legend.YOffs = -vg.Millimeter

	peak := limit
	for _, b := range d.bins {
		peak = max(peak, value(b))
	}
	p.X.Min, p.X.Max = 0, d.end
	if n := len(d.bins); n > 0 && d.bins[n-1].t >= d.end {
		p.X.Max = d.bins[n-1].t + 1
	}
	// Room above the data for the legend.
	p.Y.Min, p.Y.Max = 0, max(1.35*peak, 1.6*limit)
	return p, nil
}

// burstNote returns what the legend says of a limit's burst.
func burstNote(burst int64) string {
	if burst <= 0 {
		return ""
	}
	return ", burst " + group(float64(burst))
}

// stepLine returns a line that holds each bin's value over its second,
// the last up to end (the run ends within it) if end lies within it.
func stepLine(bins []bin, value func(bin) float64, end float64) (*plotter.Line, error) {
	pts := make(plotter.XYs, 0, len(bins)+1)
	for _, b := range bins {
		pts = append(pts, plotter.XY{X: b.t, Y: value(b)})
	}
	if n := len(bins); n > 0 {
		last := bins[n-1]
		x := last.t + 1
		if end > last.t && end < x {
			x = end
		}
		pts = append(pts, plotter.XY{X: x, Y: value(last)})
	} else {
		pts = append(pts, plotter.XY{})
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return nil, err
	}
	l.StepStyle = plotter.PostStep
	return l, nil
}

// roundTicks are 4 to 8 labelled ticks at multiples of 1, 2, 2.5 or 5
// times a power of ten, with unlabelled ones halfway.
type roundTicks struct{}

func (roundTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return plot.DefaultTicks{}.Ticks(lo, hi)
	}
	raw := (hi - lo) / 6
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * mag
	for _, m := range []float64{1, 2, 2.5, 5} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var ticks []plot.Tick
	for i := math.Ceil(lo / step * 2); i/2*step <= hi; i++ {
		v := i / 2 * step
		t := plot.Tick{Value: v}
		if math.Mod(i, 2) == 0 {
			t.Label = formatRate(v)
		}
		ticks = append(ticks, t)
	}
	return ticks
}

// formatRate formats v with commas between thousands, and one decimal if
// it has a fraction.
func formatRate(v float64) string {
	if v == float64(int64(v)) || v >= 1000 {
		return group(v)
	}
	return fmt.Sprintf("%.1f", v)
}
