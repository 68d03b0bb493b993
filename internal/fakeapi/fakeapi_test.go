package fakeapi

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestLimiter(t *testing.T) {
	l := NewLimiter(10, 2, nil)
	codes := map[int]int{}
	var last *httptest.ResponseRecorder
	for range 4 {
		w := httptest.NewRecorder()
		l.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
		codes[w.Code]++
		last = w
	}
	assert.Equal(t, map[int]int{200: 2, 429: 2}, codes)
	assert.Equal(t, "1", last.Header().Get("Retry-After"))
	assert.NotEmpty(t, last.Header().Get("Retry-After-Ms"))
	st := l.Stats()
	assert.EqualValues(t, 4, st.Requests)
	assert.EqualValues(t, 2, st.Rejected)
	time.Sleep(150 * time.Millisecond) // one token back at 10/s
	w := httptest.NewRecorder()
	l.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, http.StatusOK, w.Code)
}
