package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// How often the progress is drawn: on a terminal, and elsewhere (a log,
// a pipe), where every update is a line of its own.
const (
	terminalEvery = 200 * time.Millisecond
	lineEvery     = 5 * time.Second
)

// barWidth is the width of the bar, in characters.
const barWidth = 20

// progress shows the fleet's progress on w while it runs: a bar redrawn
// in place if w is a terminal, a line every lineEvery otherwise.
type progress struct {
	w     io.Writer
	tty   bool
	total int
	start time.Time

	mu     sync.Mutex
	done   int
	failed int
	tokens int64
	width  int // of the last bar drawn

	stop chan struct{}
	wg   sync.WaitGroup
}

// newProgress starts showing the progress of total calls, from start.
func newProgress(w io.Writer, total int, start time.Time) *progress {
	p := &progress{w: w, tty: isTerminal(w), total: total, start: start, stop: make(chan struct{})}
	every := lineEvery
	if p.tty {
		every = terminalEvery
	}
	p.wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.draw(false)
			case <-p.stop:
				return
			}
		}
	})
	return p
}

// add counts a call that ended, with the tokens it used.
func (p *progress) add(ok bool, tokens int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	if !ok {
		p.failed++
	}
	p.tokens += int64(tokens)
}

// close stops the updates; on a terminal it draws the bar a last time and
// ends its line.
func (p *progress) close() {
	close(p.stop)
	p.wg.Wait()
	if p.tty {
		p.draw(true)
	}
}

// draw shows the progress so far; last ends the bar's line.
func (p *progress) draw(last bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	elapsed := time.Since(p.start)
	if elapsed < 0 {
		if p.tty {
			p.put("llmfleet: starting the workers…", false)
		}
		return
	}
	secs := max(elapsed.Seconds(), 1e-3)
	stats := fmt.Sprintf("%d/%d calls", p.done, p.total)
	if p.failed > 0 {
		stats += fmt.Sprintf(" (%d failed)", p.failed)
	}
	stats += fmt.Sprintf(", %.1f calls/s, %s tokens/s, %.0f s", float64(p.done)/secs, group(float64(p.tokens)/secs), secs)
	if !p.tty {
		fmt.Fprintf(p.w, "llmfleet: %s\n", stats)
		return
	}
	filled := barWidth * p.done / max(p.total, 1)
	bar := strings.Repeat("█", filled) + strings.Repeat("░", barWidth-filled)
	p.put(fmt.Sprintf("%s %3d%% %s", bar, 100*p.done/max(p.total, 1), stats), last)
}

// put draws line over the previous one. p.mu is held.
func (p *progress) put(line string, last bool) {
	n := len([]rune(line))
	pad := strings.Repeat(" ", max(p.width-n, 0))
	p.width = n
	end := ""
	if last {
		end = "\n"
	}
	fmt.Fprintf(p.w, "\r%s%s%s", line, pad, end)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
