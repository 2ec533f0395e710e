// Package faultproxy is a TCP proxy on loopback that injects network faults between clients and
// one server, for the reliability tests: connection resets (RST), half-open stalls (a blackhole
// that neither forwards nor closes), latency, connections cut after a number of bytes, and
// refused new connections. These mirror Toxiproxy's reset_peer, timeout, latency and limit_data
// toxics, with no process or dependency of its own.
//
// Every fault applies to the open connections and to those opened while it is on. Faults change
// at any time from any goroutine.
package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards the connections made to Addr to its target.
type Proxy struct {
	ln     net.Listener
	target string

	mu        sync.Mutex
	links     map[*link]struct{}
	holeUntil time.Time
	latency   time.Duration
	cutAfter  int64
	refuse    bool
	closed    bool
	// changed is closed (and replaced) whenever a fault changes, to wake waiting pumps.
	changed chan struct{}

	accepted atomic.Int64
	resets   atomic.Int64
	wg       sync.WaitGroup
}

// Stats counts what the proxy did.
type Stats struct {
	// Accepted is how many client connections it accepted; Open how many are open now.
	Accepted, Open int
	// Resets is how many connections it reset (ResetAll, CutAfterBytes, RefuseNew).
	Resets int
}

// New starts a proxy on a free port of 127.0.0.1 that forwards to target ("host:port").
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, links: map[*link]struct{}{}, changed: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's address ("127.0.0.1:port").
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port is the proxy's port.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// ResetAll resets every open connection: both peers get a TCP RST (SO_LINGER 0), as when a
// middlebox or the server's host drops the connection. It returns how many it reset.
func (p *Proxy) ResetAll() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.reset()
	}
	return len(links)
}

// Blackhole stops forwarding, in both directions and on every connection (open or opened
// meanwhile), for d, without closing anything: the peers see a half-open connection that
// neither answers nor fails. Afterwards forwarding resumes, and what was sent meanwhile is
// delivered late. A later call replaces the end of the current blackhole; 0 ends it now.
func (p *Proxy) Blackhole(d time.Duration) {
	p.set(func() { p.holeUntil = time.Now().Add(d) })
}

// Latency delays every chunk forwarded, in each direction, by d (0: none); a request and its
// reply take 2d more.
func (p *Proxy) Latency(d time.Duration) {
	p.set(func() { p.latency = d })
}

// CutAfterBytes resets each connection that goes past n bytes in total, both directions counted
// from its start (0: never). The bytes up to the limit are delivered.
func (p *Proxy) CutAfterBytes(n int64) {
	p.set(func() { p.cutAfter = n })
}

// RefuseNew makes new connections fail at once (accepted, then reset) while on; open
// connections are untouched.
func (p *Proxy) RefuseNew(on bool) {
	p.set(func() { p.refuse = on })
}

// Heal turns every fault off.
func (p *Proxy) Heal() {
	p.set(func() {
		p.holeUntil, p.latency, p.cutAfter, p.refuse = time.Time{}, 0, 0, false
	})
}

// Stats reports the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	open := len(p.links)
	p.mu.Unlock()
	return Stats{Accepted: int(p.accepted.Load()), Open: open, Resets: int(p.resets.Load())}
}

// Close stops accepting, closes every connection and waits for the proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) set(change func()) {
	p.mu.Lock()
	change()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.accepted.Add(1)
		client := c.(*net.TCPConn)
		p.mu.Lock()
		refuse, closed := p.refuse, p.closed
		p.mu.Unlock()
		if refuse || closed {
			p.resets.Add(1)
			_ = client.SetLinger(0)
			_ = client.Close()
			continue
		}
		p.wg.Add(1)
		go p.open(client)
	}
}

// open dials the target for a new client connection and starts forwarding.
func (p *Proxy) open(client *net.TCPConn) {
	defer p.wg.Done()
	// A connection opened during a blackhole stalls too: the client's connect succeeds (the
	// proxy accepted it) and then nothing happens until the blackhole ends.
	l := &link{p: p, client: client, done: make(chan struct{})}
	if !p.register(l) {
		_ = client.Close()
		return
	}
	if !p.wait(l) {
		p.unregister(l)
		return
	}
	s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		l.reset()
		p.unregister(l)
		return
	}
	l.mu.Lock()
	l.server = s.(*net.TCPConn)
	gone := l.gone
	l.mu.Unlock()
	if gone {
		_ = l.server.SetLinger(0)
		_ = l.server.Close()
		p.unregister(l)
		return
	}
	var both sync.WaitGroup
	both.Add(2)
	go func() { defer both.Done(); p.pump(l, l.server, client) }()
	go func() { defer both.Done(); p.pump(l, client, l.server) }()
	both.Wait()
	l.close()
	p.unregister(l)
}

func (p *Proxy) register(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.links[l] = struct{}{}
	return true
}

func (p *Proxy) unregister(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

// wait returns once no blackhole is on (true), or once the link is closed (false).
func (p *Proxy) wait(l *link) bool {
	for {
		p.mu.Lock()
		until, changed := p.holeUntil, p.changed
		p.mu.Unlock()
		left := time.Until(until)
		if left <= 0 {
			select {
			case <-l.done:
				return false
			default:
				return true
			}
		}
		t := time.NewTimer(left)
		select {
		case <-t.C:
		case <-changed:
		case <-l.done:
			t.Stop()
			return false
		}
		t.Stop()
	}
}

// pump forwards src to dst until src ends or the link is closed, applying the faults.
func (p *Proxy) pump(l *link, dst, src *net.TCPConn) {
	buf := make([]byte, 32<<10)
	for {
		if !p.wait(l) {
			return
		}
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait(l) {
				return
			}
			p.mu.Lock()
			lat, cut := p.latency, p.cutAfter
			p.mu.Unlock()
			if lat > 0 {
				t := time.NewTimer(lat)
				select {
				case <-t.C:
				case <-l.done:
					t.Stop()
					return
				}
			}
			chunk := buf[:n]
			over := false
			if total := l.bytes.Add(int64(n)); cut > 0 && total > cut {
				keep := max(int64(n)-(total-cut), 0)
				chunk, over = chunk[:keep], true
			}
			if len(chunk) > 0 {
				if _, werr := dst.Write(chunk); werr != nil {
					l.reset()
					return
				}
			}
			if over {
				l.reset()
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				// An orderly close of one side: pass it on, and let the other direction finish.
				_ = dst.CloseWrite()
				return
			}
			l.reset()
			return
		}
	}
}

// link is one proxied connection: the client's and the server's sides.
type link struct {
	p      *Proxy
	client *net.TCPConn
	bytes  atomic.Int64
	done   chan struct{}

	mu     sync.Mutex
	server *net.TCPConn
	gone   bool
}

// reset closes both sides with a RST.
func (l *link) reset() { l.shut(true) }

// close closes both sides (orderly).
func (l *link) close() { l.shut(false) }

func (l *link) shut(rst bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.gone {
		return
	}
	l.gone = true
	if rst {
		l.p.resets.Add(1) // counted before the peers can see it
	}
	close(l.done)
	for _, c := range []*net.TCPConn{l.client, l.server} {
		if c == nil {
			continue
		}
		if rst {
			_ = c.SetLinger(0)
		}
		_ = c.Close()
	}
}
