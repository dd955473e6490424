package main

import "testing"

// TestRuntimeMemory: serve sets its soft memory limit unless the operator
// set one (GOMEMLIMIT), and its collector target unless the operator set
// GOGC; GOGC=off leaves the runtime with neither.
func TestRuntimeMemory(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want runtimeMemory
	}{
		{"nothing set", nil, runtimeMemory{defaultMemoryLimit, true, defaultGCPercent, true}},
		{"GOMEMLIMIT set", map[string]string{"GOMEMLIMIT": "200MiB"}, runtimeMemory{0, false, defaultGCPercent, true}},
		{"GOMEMLIMIT off", map[string]string{"GOMEMLIMIT": "off"}, runtimeMemory{0, false, defaultGCPercent, true}},
		{"GOMEMLIMIT blank", map[string]string{"GOMEMLIMIT": " "}, runtimeMemory{defaultMemoryLimit, true, defaultGCPercent, true}},
		{"GOGC off", map[string]string{"GOGC": "off"}, runtimeMemory{}},
		{"GOGC OFF (not the runtime's off: its 100%)", map[string]string{"GOGC": "OFF"}, runtimeMemory{defaultMemoryLimit, true, 0, false}},
		{"GOGC a percentage", map[string]string{"GOGC": "50"}, runtimeMemory{defaultMemoryLimit, true, 0, false}},
		{"GOGC blank", map[string]string{"GOGC": " "}, runtimeMemory{defaultMemoryLimit, true, defaultGCPercent, true}},
		{"GOGC and GOMEMLIMIT", map[string]string{"GOGC": "200", "GOMEMLIMIT": "1GiB"}, runtimeMemory{}},
		{"GOGC off and GOMEMLIMIT", map[string]string{"GOGC": "off", "GOMEMLIMIT": "1GiB"}, runtimeMemory{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := chooseRuntimeMemory(func(k string) string { return tt.env[k] }); got != tt.want {
				t.Errorf("chooseRuntimeMemory = %+v; want %+v", got, tt.want)
			}
		})
	}
}
