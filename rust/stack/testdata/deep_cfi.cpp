// A function whose CFI states more register rules than the compiled rules' storage holds
// (every xmm and x87 register "same value": no compiler writes that, a hand-written function
// may): the rule compiler cannot evaluate its second row, and the steps from there on must go
// to framehop, whose storage holds them, rather than take the first row's rule.
//
//   void k15_deep_cfi_call(void (*callback)());
asm(R"(
    .text
    .globl k15_deep_cfi_call
    .type k15_deep_cfi_call, @function
k15_deep_cfi_call:
    .cfi_startproc
    pushq %rbx
    .cfi_adjust_cfa_offset 8
    .cfi_offset %rbx, -16
    .cfi_same_value 17
    .cfi_same_value 18
    .cfi_same_value 19
    .cfi_same_value 20
    .cfi_same_value 21
    .cfi_same_value 22
    .cfi_same_value 23
    .cfi_same_value 24
    .cfi_same_value 25
    .cfi_same_value 26
    .cfi_same_value 27
    .cfi_same_value 28
    .cfi_same_value 29
    .cfi_same_value 30
    .cfi_same_value 31
    .cfi_same_value 32
    .cfi_same_value 33
    .cfi_same_value 34
    .cfi_same_value 35
    .cfi_same_value 36
    .cfi_same_value 37
    .cfi_same_value 38
    .cfi_same_value 39
    .cfi_same_value 40
    .cfi_same_value 41
    subq $16, %rsp
    .cfi_adjust_cfa_offset 16
    call *%rdi
    addq $16, %rsp
    .cfi_adjust_cfa_offset -16
    popq %rbx
    .cfi_adjust_cfa_offset -8
    ret
    .cfi_endproc
    .size k15_deep_cfi_call, .-k15_deep_cfi_call
)");
