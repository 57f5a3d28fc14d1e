// The toolchain's libstdc++ floor shim (design.md §8.3): linked into every C++ link the toolchain makes.
//
// The sysroot's libstdc++ is gcc 10's (GLIBCXX_3.4.28); torch's manylinux_2_28 floor allows
// GLIBCXX_3.4.24 (gcc 8). Some members that gcc 9 and 10 added are defined inline in the headers,
// but the headers' `extern template` declarations make every caller bind the library's exported
// copy, at a version past the floor. This file instantiates those members itself; the wrapper links
// its archive ahead of libstdc++ with --exclude-libs, so a wheel carries them as hidden local code
// and needs only what gcc 8's libstdc++ already exports. RHEL's devtoolset does the same with
// libstdc++_nonshared.a. What no header defines (std::filesystem, std::pmr) is left to the verify
// step's floor check, which names the symbol.
//
// Compiled twice, as C++17: once as is (the C++11 string ABI) and once with _GLIBCXX_USE_CXX11_ABI=0.
#include <ostream>
#include <sstream>
#include <string>

namespace std _GLIBCXX_VISIBILITY(default) {
_GLIBCXX_BEGIN_NAMESPACE_VERSION
_GLIBCXX_BEGIN_NAMESPACE_CXX11

// GLIBCXX_3.4.26: the default constructors of the string streams (gcc 9).
template basic_stringbuf<char>::basic_stringbuf();
template basic_stringbuf<wchar_t>::basic_stringbuf();
template basic_istringstream<char>::basic_istringstream();
template basic_istringstream<wchar_t>::basic_istringstream();
template basic_ostringstream<char>::basic_ostringstream();
template basic_ostringstream<wchar_t>::basic_ostringstream();
template basic_stringstream<char>::basic_stringstream();
template basic_stringstream<wchar_t>::basic_stringstream();


// GLIBCXX_3.4.26: C++17 members of basic_string (gcc 9): data(), the string_view conversion and the
// private helpers the string_view constructors and assignments call.
template basic_string<char>::pointer basic_string<char>::data() noexcept;
template basic_string<wchar_t>::pointer basic_string<wchar_t>::data() noexcept;
template basic_string<char>::operator basic_string<char>::__sv_type() const noexcept;
template basic_string<wchar_t>::operator basic_string<wchar_t>::__sv_type() const noexcept;
template basic_string<char>::__sv_type basic_string<char>::_S_to_string_view(__sv_type) noexcept;
template basic_string<wchar_t>::__sv_type basic_string<wchar_t>::_S_to_string_view(__sv_type) noexcept;
template basic_string<char>::__sv_wrapper::__sv_wrapper(__sv_type) noexcept;
template basic_string<wchar_t>::__sv_wrapper::__sv_wrapper(__sv_type) noexcept;
template basic_string<char>::basic_string(__sv_wrapper, const allocator<char>&);
template basic_string<wchar_t>::basic_string(__sv_wrapper, const allocator<wchar_t>&);
#if _GLIBCXX_USE_CXX11_ABI
template basic_string<char>::iterator basic_string<char>::insert(const_iterator, initializer_list<char>);
template basic_string<wchar_t>::iterator basic_string<wchar_t>::insert(const_iterator, initializer_list<wchar_t>);
#else
// The copy-on-write string gained its allocator-extended copy and move constructors in gcc 9.
template basic_string<char>::basic_string(const basic_string&, const allocator<char>&);
template basic_string<wchar_t>::basic_string(const basic_string&, const allocator<wchar_t>&);
template basic_string<char>::basic_string(basic_string&&, const allocator<char>&);
template basic_string<wchar_t>::basic_string(basic_string&&, const allocator<wchar_t>&);
#endif

_GLIBCXX_END_NAMESPACE_CXX11

// GLIBCXX_3.4.26: inserting a null pointer constant into a stream (C++17, gcc 9).
template basic_ostream<char>& basic_ostream<char>::operator<<(nullptr_t);
template basic_ostream<wchar_t>& basic_ostream<wchar_t>::operator<<(nullptr_t);

_GLIBCXX_END_NAMESPACE_VERSION
}
