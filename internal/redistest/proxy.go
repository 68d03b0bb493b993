package redistest

import (
	"bytes"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy on a free port of 127.0.0.1 in front of a Redis
// server, with faults that can be set while it runs: latency, lost replies,
// reset connections, refused connections, another upstream. It is safe for
// concurrent use.
//
// Each connection is two pipes, client to upstream and back. A pipe reads
// chunks as they come and writes each one latency after it was read, in the
// order read: latency delays bytes, never reorders them, and a request and
// its reply pay it once each way. A new connection pays it through its first
// round trip (go-redis's HELLO), not through the TCP handshake, which the
// kernel completes before the proxy sees it.
type Proxy struct {
	Addr string // where clients connect

	t       testing.TB
	dropped atomic.Int64

	mu       sync.Mutex
	ln       net.Listener // nil while refusing
	upstream string
	latency  time.Duration // one way
	drop     float64
	conns    map[*proxyConn]struct{}
	closed   bool
	wg       sync.WaitGroup
}

// NewProxy starts a proxy to upstream for t; it is closed, with every
// connection through it, when t ends.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: proxy listen: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), t: t, ln: ln, upstream: upstream, conns: map[*proxyConn]struct{}{}}
	p.serve(ln)
	t.Cleanup(p.close)
	return p
}

// SetLatency delays the data of every connection by d in each direction,
// from now on: a round trip takes 2d more. d ≤ 0 means none.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = max(d, 0)
	p.mu.Unlock()
}

// SetDropReplies makes the proxy lose each chunk of reply data it reads
// from upstream with probability frac (0 to 1), from now on: the server ran
// the command, and the client never sees its reply but an orderly close of
// the connection (it reads EOF, which go-redis retries on a new
// connection; a reset it would not). The replies to the commands that set
// up a connection (HELLO, AUTH, CLIENT, SELECT, READONLY) are never lost,
// so the fault hits commands, not dials. A reply is lost whole only if it
// came in one chunk, as small ones do; a large one may be cut short.
func (p *Proxy) SetDropReplies(frac float64) {
	p.mu.Lock()
	p.drop = min(max(frac, 0), 1)
	p.mu.Unlock()
}

// Dropped returns how many replies the proxy has lost so far.
func (p *Proxy) Dropped() int64 { return p.dropped.Load() }

// ResetAll resets every open connection, on both sides, now.
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.kill(true)
	}
}

// Refuse closes the proxy's listening socket, so that new connections are
// refused (open ones carry on), if on; else it listens again on the same
// address.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
	case on && p.ln != nil:
		p.ln.Close()
		p.ln = nil
	case !on && p.ln == nil:
		var ln net.Listener
		var err error
		for range 50 { // the port was ours a moment ago; wait if another took it
			if ln, err = net.Listen("tcp", p.Addr); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			p.t.Errorf("redistest: proxy listen again on %s: %v", p.Addr, err)
			return
		}
		p.ln = ln
		p.serve(ln)
	}
}

// SetUpstream makes new connections go to addr; open ones stay where they
// are (ResetAll ends them, as a failover would).
func (p *Proxy) SetUpstream(addr string) {
	p.mu.Lock()
	p.upstream = addr
	p.mu.Unlock()
}

// Upstream returns the address new connections go to.
func (p *Proxy) Upstream() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.upstream
}

func (p *Proxy) close() {
	p.mu.Lock()
	p.closed = true
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	p.mu.Unlock()
	p.ResetAll()
	p.wg.Wait()
}

// serve accepts connections on ln, in a goroutine, until ln is closed.
func (p *Proxy) serve(ln net.Listener) {
	p.wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			upstream, closed := p.upstream, p.closed
			p.mu.Unlock()
			if closed {
				client.Close()
				return
			}
			p.wg.Go(func() { p.handle(client, upstream) })
		}
	})
}

// handle connects client to upstream and runs the two pipes until either
// side ends.
func (p *Proxy) handle(client net.Conn, upstream string) {
	server, err := net.DialTimeout("tcp", upstream, 5*time.Second)
	if err != nil {
		reset(client) // the client sees the upstream's refusal as a reset
		return
	}
	c := &proxyConn{client: client, server: server, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.kill(true)
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { p.pipe(c, client, server, false) })
	wg.Go(func() { p.pipe(c, server, client, true) })
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// proxyConn is one client connection and its upstream connection.
type proxyConn struct {
	client, server net.Conn
	last           atomic.Value // string: the command the client sent last
	once           sync.Once
	done           chan struct{} // closed by kill
}

// kill closes both sides, with a reset if rst, else in order (FIN).
func (c *proxyConn) kill(rst bool) {
	c.once.Do(func() {
		close(c.done)
		if rst {
			reset(c.client)
			reset(c.server)
		} else {
			c.client.Close()
			c.server.Close()
		}
	})
}

// handshaking reports whether the client's last command set up the
// connection (or there was none yet).
func (c *proxyConn) handshaking() bool {
	name, _ := c.last.Load().(string)
	return name == "" || handshake[name]
}

// reset closes conn with a TCP reset instead of an orderly close.
func reset(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	conn.Close()
}

// chunk is data read from one side, due on the other at due; a nil data
// with drop set stands for a lost reply.
type chunk struct {
	data []byte
	due  time.Time
	drop bool
}

// pipe copies src to dst through a queue that delays each chunk by the
// latency set when it was read. On a reply pipe it loses replies as
// SetDropReplies says. It kills c when either side ends.
func (p *Proxy) pipe(c *proxyConn, src, dst net.Conn, replies bool) {
	q := make(chan chunk, 256)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		defer close(q)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				p.mu.Lock()
				lat, drop := p.latency, p.drop
				p.mu.Unlock()
				ch := chunk{due: time.Now().Add(lat)}
				switch {
				case !replies:
					if name := commandName(buf[:n]); name != "" {
						c.last.Store(name)
					}
					ch.data = append([]byte(nil), buf[:n]...)
				case drop > 0 && !c.handshaking() && rand.Float64() < drop:
					p.dropped.Add(1)
					ch.drop = true
				default:
					ch.data = append([]byte(nil), buf[:n]...)
				}
				select {
				case q <- ch:
				case <-c.done:
					return
				}
				if ch.drop {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		c.kill(false)
		<-readerDone
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ch := range q {
		if d := time.Until(ch.due); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-c.done:
				return
			}
		}
		if ch.drop {
			return // the deferred kill closes the client's connection in order
		}
		if _, err := dst.Write(ch.data); err != nil {
			return
		}
	}
}

// handshake names the commands whose replies are never lost: those by which
// a client sets up a connection.
var handshake = map[string]bool{"HELLO": true, "AUTH": true, "CLIENT": true, "SELECT": true, "READONLY": true}

// commandName returns the upper-cased name of the first command in b, a
// RESP array of bulk strings as clients send, or "" if b does not start
// with one.
func commandName(b []byte) string {
	// *<n>\r\n$<len>\r\n<name>\r\n
	if len(b) == 0 || b[0] != '*' {
		return ""
	}
	i := bytes.Index(b, []byte("\r\n"))
	if i < 0 || i+2 >= len(b) || b[i+2] != '$' {
		return ""
	}
	b = b[i+3:]
	j := bytes.Index(b, []byte("\r\n"))
	if j < 0 {
		return ""
	}
	n, err := strconv.Atoi(string(b[:j]))
	if err != nil || n < 0 || j+2+n > len(b) {
		return ""
	}
	return string(bytes.ToUpper(b[j+2 : j+2+n]))
}
