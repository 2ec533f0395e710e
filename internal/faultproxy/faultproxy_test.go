package faultproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo starts a server that echoes every connection back, closed when the test ends.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

func proxy(t *testing.T) *Proxy {
	t.Helper()
	p, err := New(echo(t))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes msg and reads its echo within timeout.
func roundTrip(c net.Conn, msg []byte, timeout time.Duration) error {
	if _, err := c.Write(msg); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if !bytes.Equal(got, msg) {
		return errors.New("echo differs")
	}
	return nil
}

func TestForwards(t *testing.T) {
	p := proxy(t)
	c := dial(t, p)
	big := bytes.Repeat([]byte("0123456789"), 100_000) // 1 MB, many chunks each way
	go func() { _, _ = c.Write(big) }()
	got := make([]byte, len(big))
	_, err := io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, big, got)
	require.Equal(t, 1, p.Stats().Open)
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool { return p.Stats().Open == 0 }, 5*time.Second, 5*time.Millisecond,
		"an orderly close passes through and ends the link")
}

func TestResetAllSendsRST(t *testing.T) {
	p := proxy(t)
	a, b := dial(t, p), dial(t, p)
	require.NoError(t, roundTrip(a, []byte("hi"), 5*time.Second))
	require.NoError(t, roundTrip(b, []byte("hi"), 5*time.Second))
	require.Equal(t, 2, p.ResetAll())
	for _, c := range []net.Conn{a, b} {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		require.ErrorIs(t, err, syscall.ECONNRESET, "a reset, not an orderly close")
	}
	require.Equal(t, 2, p.Stats().Resets)
	// New connections work.
	require.NoError(t, roundTrip(dial(t, p), []byte("again"), 5*time.Second))
}

func TestBlackholeStallsThenDeliversLate(t *testing.T) {
	p := proxy(t)
	c := dial(t, p)
	require.NoError(t, roundTrip(c, []byte("before"), 5*time.Second))
	const hole = 600 * time.Millisecond
	began := time.Now()
	p.Blackhole(hole)
	// Nothing comes back while the hole lasts, and nothing fails: half-open.
	err := roundTrip(c, []byte("during"), hole/2)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	// A connection opened meanwhile is accepted but stalls too.
	fresh := dial(t, p)
	_, err = fresh.Write([]byte("fresh"))
	require.NoError(t, err)
	// Afterwards what was sent is delivered, late.
	got := make([]byte, len("during"))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, "during", string(got))
	require.GreaterOrEqual(t, time.Since(began), hole)
	got = make([]byte, len("fresh"))
	_ = fresh.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadFull(fresh, got)
	require.NoError(t, err)
	require.Equal(t, "fresh", string(got))
	require.Zero(t, p.Stats().Resets)
}

func TestBlackholeEndsEarlyWhenHealed(t *testing.T) {
	p := proxy(t)
	c := dial(t, p)
	p.Blackhole(time.Hour)
	_, err := c.Write([]byte("x"))
	require.NoError(t, err)
	time.AfterFunc(100*time.Millisecond, p.Heal)
	got := make([]byte, 1)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
}

func TestLatencyDelaysBothWays(t *testing.T) {
	p := proxy(t)
	c := dial(t, p)
	const d = 100 * time.Millisecond
	p.Latency(d)
	began := time.Now()
	require.NoError(t, roundTrip(c, []byte("slow"), 5*time.Second))
	require.GreaterOrEqual(t, time.Since(began), 2*d)
	p.Latency(0)
	began = time.Now()
	require.NoError(t, roundTrip(c, []byte("fast"), 5*time.Second))
	require.Less(t, time.Since(began), d)
}

func TestCutAfterBytes(t *testing.T) {
	p := proxy(t)
	p.CutAfterBytes(10) // both directions count: 5 out, 5 back
	c := dial(t, p)
	require.NoError(t, roundTrip(c, []byte("12345"), 5*time.Second))
	_, _ = c.Write([]byte("more"))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := c.Read(make([]byte, 4))
	require.ErrorIs(t, err, syscall.ECONNRESET)
	require.Equal(t, 1, p.Stats().Resets)
	p.CutAfterBytes(0)
	require.NoError(t, roundTrip(dial(t, p), []byte("12345678901234567890"), 5*time.Second))
}

func TestRefuseNew(t *testing.T) {
	p := proxy(t)
	old := dial(t, p)
	require.NoError(t, roundTrip(old, []byte("a"), 5*time.Second))
	p.RefuseNew(true)
	// The TCP handshake completes (the listener accepts), then the reset comes: on a busy
	// machine it may beat the dial's return.
	c, err := net.Dial("tcp", p.Addr())
	if err == nil {
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = c.Read(make([]byte, 1))
	}
	require.Error(t, err)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "refused at once, not stalled: %v", err)
	require.NoError(t, roundTrip(old, []byte("b"), 5*time.Second), "open connections are untouched")
	p.RefuseNew(false)
	require.NoError(t, roundTrip(dial(t, p), []byte("c"), 5*time.Second))
}

func TestCloseEndsEverything(t *testing.T) {
	p, err := New(echo(t))
	require.NoError(t, err)
	c := dial(t, p)
	p.Blackhole(time.Hour) // pumps waiting in the hole must not keep Close waiting
	_, _ = c.Write([]byte("x"))
	require.NoError(t, p.Close())
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded))
	_, err = net.DialTimeout("tcp", p.Addr(), time.Second)
	require.Error(t, err, "no longer listening")
}
