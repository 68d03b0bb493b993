package bucket

// Len returns how many keys l holds state for.
func (l *Local) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}
