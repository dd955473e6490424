package main

import "testing"

// TestMemoryLimit: serve sets its soft memory limit unless the operator
// set one (GOMEMLIMIT) or turned the collector off (GOGC=off); any other
// GOGC keeps it.
func TestMemoryLimit(t *testing.T) {
	tests := []struct {
		name  string
		env   map[string]string
		want  int64
		wants bool
	}{
		{"nothing set", nil, defaultMemoryLimit, true},
		{"GOMEMLIMIT set", map[string]string{"GOMEMLIMIT": "200MiB"}, 0, false},
		{"GOMEMLIMIT off", map[string]string{"GOMEMLIMIT": "off"}, 0, false},
		{"GOMEMLIMIT blank", map[string]string{"GOMEMLIMIT": " "}, defaultMemoryLimit, true},
		{"GOGC off", map[string]string{"GOGC": "off"}, 0, false},
		{"GOGC OFF", map[string]string{"GOGC": "OFF"}, 0, false},
		{"GOGC a percentage", map[string]string{"GOGC": "50"}, defaultMemoryLimit, true},
		{"GOGC off and GOMEMLIMIT", map[string]string{"GOGC": "off", "GOMEMLIMIT": "1GiB"}, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := memoryLimit(func(k string) string { return tt.env[k] })
			if got != tt.want || ok != tt.wants {
				t.Errorf("memoryLimit = %d, %v; want %d, %v", got, ok, tt.want, tt.wants)
			}
		})
	}
}
