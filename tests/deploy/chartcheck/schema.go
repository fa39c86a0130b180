// Field names and enum values of the object parts the chart writes, from the Kubernetes API
// reference (core/v1, apps/v1, policy/v1, autoscaling/v2, networking.k8s.io/v1): a typo such
// as "readinesProbe" or "IfNotPresnt" would otherwise be dropped or refused by the API server.
package main

import (
	"fmt"
	"math/big"
	"regexp"
	"sort"
	"strings"
)

func fieldSet(names string) map[string]bool {
	out := map[string]bool{}
	for _, n := range strings.Fields(names) {
		out[n] = true
	}
	return out
}

var (
	metadataFields  = fieldSet("name namespace labels annotations generateName finalizers ownerReferences")
	podSpecFields   = fieldSet("containers initContainers ephemeralContainers volumes serviceAccountName automountServiceAccountToken nodeSelector tolerations affinity securityContext imagePullSecrets terminationGracePeriodSeconds priorityClassName hostNetwork hostPID hostIPC dnsPolicy dnsConfig restartPolicy schedulerName topologySpreadConstraints runtimeClassName enableServiceLinks shareProcessNamespace hostname subdomain nodeName activeDeadlineSeconds readinessGates preemptionPolicy overhead setHostnameAsFQDN os hostAliases")
	containerFields = fieldSet("name image imagePullPolicy command args workingDir ports env envFrom resources volumeMounts volumeDevices livenessProbe readinessProbe startupProbe lifecycle terminationMessagePath terminationMessagePolicy securityContext stdin stdinOnce tty restartPolicy resizePolicy")
	probeFields     = fieldSet("exec httpGet tcpSocket grpc initialDelaySeconds timeoutSeconds periodSeconds successThreshold failureThreshold terminationGracePeriodSeconds")
	portFields      = fieldSet("name containerPort hostPort hostIP protocol")
	volumeFields    = fieldSet("name configMap secret emptyDir hostPath persistentVolumeClaim projected downwardAPI ephemeral csi")
	mountFields     = fieldSet("name mountPath subPath subPathExpr readOnly mountPropagation")
	svcSpecFields   = fieldSet("type selector ports clusterIP clusterIPs publishNotReadyAddresses internalTrafficPolicy externalTrafficPolicy sessionAffinity loadBalancerIP loadBalancerSourceRanges externalName ipFamilies ipFamilyPolicy healthCheckNodePort allocateLoadBalancerNodePorts loadBalancerClass sessionAffinityConfig")
	svcPortFields   = fieldSet("name port targetPort protocol nodePort appProtocol")
	workloadFields  = map[string]map[string]bool{
		"Deployment":  fieldSet("replicas selector template strategy minReadySeconds revisionHistoryLimit progressDeadlineSeconds paused"),
		"StatefulSet": fieldSet("replicas selector template serviceName podManagementPolicy updateStrategy volumeClaimTemplates revisionHistoryLimit minReadySeconds persistentVolumeClaimRetentionPolicy ordinals"),
		"DaemonSet":   fieldSet("selector template updateStrategy minReadySeconds revisionHistoryLimit"),
	}
	enums = map[string]map[string]bool{
		"imagePullPolicy":      fieldSet("Always IfNotPresent Never"),
		"protocol":             fieldSet("TCP UDP SCTP"),
		"serviceType":          fieldSet("ClusterIP NodePort LoadBalancer ExternalName"),
		"trafficPolicy":        fieldSet("Cluster Local"),
		"podManagementPolicy":  fieldSet("OrderedReady Parallel"),
		"tolerationOperator":   fieldSet("Exists Equal"),
		"tolerationEffect":     fieldSet("NoSchedule PreferNoSchedule NoExecute"),
		"hostPathType":         fieldSet("DirectoryOrCreate Directory FileOrCreate File Socket CharDevice BlockDevice"),
		"emptyDirMedium":       fieldSet("Memory HugePages"),
		"networkPolicyTypes":   fieldSet("Ingress Egress"),
		"secretType":           fieldSet("Opaque kubernetes.io/tls kubernetes.io/dockerconfigjson kubernetes.io/basic-auth kubernetes.io/ssh-auth kubernetes.io/service-account-token"),
		"updateStrategyDaemon": fieldSet("RollingUpdate OnDelete"),
		"updateStrategyDeploy": fieldSet("RollingUpdate Recreate"),
	}
)

func (c *checker) unknownFields(o *object, where string, v interface{}, allowed map[string]bool) {
	var bad []string
	for k := range m(v) {
		if !allowed[k] {
			bad = append(bad, k)
		}
	}
	sort.Strings(bad)
	for _, k := range bad {
		c.errorf(o, "%sunknown field %q", where, k)
	}
}

func (c *checker) enum(o *object, where, kind string, v interface{}) {
	if v == nil {
		return
	}
	if !enums[kind][s(v)] {
		c.errorf(o, "%s%q is not one of %v", where, s(v), sortedKeys(enums[kind]))
	}
}

func sortedKeys(set map[string]bool) []string {
	var out []string
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// checkSchema: field names and enums of metadata, workloads, pod specs, containers and Services.
func (c *checker) checkSchema(o *object) {
	c.unknownFields(o, "metadata: ", o.body["metadata"], metadataFields)
	switch o.kind {
	case "Deployment", "StatefulSet", "DaemonSet":
		spec := m(o.body["spec"])
		c.unknownFields(o, "spec: ", spec, workloadFields[o.kind])
		c.enum(o, "spec.podManagementPolicy: ", "podManagementPolicy", spec["podManagementPolicy"])
		switch o.kind {
		case "DaemonSet":
			c.enum(o, "spec.updateStrategy.type: ", "updateStrategyDaemon", get(spec, "updateStrategy", "type"))
		case "Deployment":
			c.enum(o, "spec.strategy.type: ", "updateStrategyDeploy", get(spec, "strategy", "type"))
		}
		c.unknownFields(o, "spec.template.metadata: ", get(spec, "template", "metadata"), metadataFields)
		pod := m(get(spec, "template", "spec"))
		c.unknownFields(o, "pod spec: ", pod, podSpecFields)
		for i, t := range l(pod["tolerations"]) {
			w := fmt.Sprintf("tolerations[%d]: ", i)
			c.enum(o, w+"operator ", "tolerationOperator", get(t, "operator"))
			c.enum(o, w+"effect ", "tolerationEffect", get(t, "effect"))
		}
		for _, v := range l(pod["volumes"]) {
			w := fmt.Sprintf("volume %s: ", s(get(v, "name")))
			c.unknownFields(o, w, v, volumeFields)
			c.enum(o, w+"hostPath.type ", "hostPathType", get(v, "hostPath", "type"))
			c.enum(o, w+"emptyDir.medium ", "emptyDirMedium", get(v, "emptyDir", "medium"))
		}
		for _, ct := range containers(pod) {
			w := fmt.Sprintf("container %s: ", s(ct["name"]))
			c.unknownFields(o, w, ct, containerFields)
			c.enum(o, w+"imagePullPolicy ", "imagePullPolicy", ct["imagePullPolicy"])
			for _, p := range l(ct["ports"]) {
				c.unknownFields(o, w+"port: ", p, portFields)
				c.enum(o, w+"port protocol ", "protocol", get(p, "protocol"))
			}
			for _, vm := range l(ct["volumeMounts"]) {
				c.unknownFields(o, w+"volumeMount: ", vm, mountFields)
			}
			for _, probe := range []string{"readinessProbe", "livenessProbe", "startupProbe"} {
				c.unknownFields(o, w+probe+": ", ct[probe], probeFields)
			}
			c.checkRequestsWithinLimits(o, w, m(ct["resources"]))
		}
	case "Service":
		spec := m(o.body["spec"])
		c.unknownFields(o, "spec: ", spec, svcSpecFields)
		c.enum(o, "spec.type: ", "serviceType", spec["type"])
		c.enum(o, "spec.internalTrafficPolicy: ", "trafficPolicy", spec["internalTrafficPolicy"])
		for _, p := range l(spec["ports"]) {
			c.unknownFields(o, "port: ", p, svcPortFields)
			c.enum(o, "port protocol: ", "protocol", get(p, "protocol"))
		}
	case "NetworkPolicy":
		for _, t := range l(get(o.body, "spec", "policyTypes")) {
			c.enum(o, "spec.policyTypes: ", "networkPolicyTypes", t)
		}
	case "Secret":
		c.enum(o, "type: ", "secretType", o.body["type"])
	}
}

var quantityParts = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$`)

// parseQuantity: a Kubernetes quantity as an exact rational (binary and decimal suffixes).
func parseQuantity(q string) (*big.Rat, bool) {
	mm := quantityParts.FindStringSubmatch(q)
	if mm == nil {
		return nil, false
	}
	r, ok := new(big.Rat).SetString(mm[1])
	if !ok {
		return nil, false
	}
	mult := map[string]int64{"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
		"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}
	if mm[2] == "m" {
		return r.Quo(r, big.NewRat(1000, 1)), true
	}
	return r.Mul(r, new(big.Rat).SetInt64(mult[mm[2]])), true
}

func (c *checker) checkRequestsWithinLimits(o *object, where string, res map[string]interface{}) {
	for name, lim := range m(res["limits"]) {
		req, ok := m(res["requests"])[name]
		if !ok {
			continue
		}
		rq, ok1 := parseQuantity(s(req))
		lq, ok2 := parseQuantity(s(lim))
		if ok1 && ok2 && rq.Cmp(lq) > 0 {
			c.errorf(o, "%sresources.requests.%s %s exceeds its limit %s", where, name, s(req), s(lim))
		}
	}
}
