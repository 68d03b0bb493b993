package bucket

import (
	"context"
	"fmt"
	"sync"
)

// LocalInFlight is a Semaphore kept in this process's memory: at most n
// calls in flight on a key in this process, the callers served in the
// order they came. A key's state is dropped once nothing holds or waits
// for it. LocalInFlight is safe for concurrent use.
type LocalInFlight struct {
	n int

	mu   sync.Mutex
	keys map[string]*localFlight
}

var _ Semaphore = (*LocalInFlight)(nil)

// localFlight is one key's slots: how many are held, and who waits, in order.
type localFlight struct {
	held  int
	queue []*localWaiter
}

// localWaiter is a caller waiting for a slot; ready is closed, under
// LocalInFlight.mu, once it holds one.
type localWaiter struct{ ready chan struct{} }

// NewLocalInFlight returns an in-process Semaphore that lets at most n calls
// be in flight on a key. It panics if n is not between 1 and 2^20.
func NewLocalInFlight(n int) *LocalInFlight {
	if n < 1 || n > maxInFlight {
		panic(fmt.Sprintf("bucket: NewLocalInFlight(n = %d): n is between 1 and %d", n, maxInFlight))
	}
	return &LocalInFlight{n: n, keys: map[string]*localFlight{}}
}

// Acquire implements Semaphore. A slot given back goes straight to the
// first waiter: nobody polls.
func (l *LocalInFlight) Acquire(ctx context.Context, key string) (func(), error) {
	if key == "" {
		return nil, ErrInvalidKey
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	k := l.keys[key]
	if k == nil {
		k = &localFlight{}
		l.keys[key] = k
	}
	if k.held < l.n && len(k.queue) == 0 {
		k.held++
		l.mu.Unlock()
		return l.releaser(key, k), nil
	}
	w := &localWaiter{ready: make(chan struct{})}
	k.queue = append(k.queue, w)
	l.mu.Unlock()
	select {
	case <-w.ready:
		return l.releaser(key, k), nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	select {
	case <-w.ready: // it came meanwhile: to the next one
		l.releaseLocked(key, k)
	default:
		for i, x := range k.queue {
			if x == w {
				k.queue = append(k.queue[:i], k.queue[i+1:]...)
				break
			}
		}
		l.forgetLocked(key, k)
	}
	l.mu.Unlock()
	return nil, ctx.Err()
}

func (l *LocalInFlight) releaser(key string, k *localFlight) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			l.releaseLocked(key, k)
			l.mu.Unlock()
		})
	}
}

// releaseLocked gives one of k's slots back: to the first waiter, if any.
func (l *LocalInFlight) releaseLocked(key string, k *localFlight) {
	if len(k.queue) > 0 {
		w := k.queue[0]
		k.queue[0] = nil
		k.queue = k.queue[1:]
		close(w.ready)
		return
	}
	k.held--
	l.forgetLocked(key, k)
}

func (l *LocalInFlight) forgetLocked(key string, k *localFlight) {
	if k.held == 0 && len(k.queue) == 0 && l.keys[key] == k {
		delete(l.keys, key)
	}
}

// Held returns how many of key's slots are held in this process now.
func (l *LocalInFlight) Held(key string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k := l.keys[key]; k != nil {
		return k.held
	}
	return 0
}
